"""Opening a store for writing: create it, resume an interrupted one, or refuse.

One policy for every case: a complete store, one written with other options or by an older
format, or one whose inputs changed since their sources were tiled is refused with the fix
(--overwrite, or rerunning the original command); a directory that is not a chip store is
never replaced. Resuming cuts the store back to its done sources (`truncate_to_done`).

A rerun may change only the options of TILE_RERUN_MAY_CHANGE (where the store is, how many
workers cut it, credentials, --overwrite); every other TileConfig option decides the chips
and must match the store's (`StoreParams`, and the class table itself: `--num-classes` of
an identity map), or the rerun is refused naming the option and both values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import zarr

from tiling.chipstore.params import ARRAY_NAMES, StoreParams, create_arrays, differences
from tiling.chipstore.records import SourceRecord
from tiling.chipstore.source_table import (
    create_source_table,
    has_source_table,
    read_label_fingerprints,
    read_params,
    read_summary,
)
from tiling.chipstore.store_format import FORMAT_VERSION, array, chip_store_meta
from tiling.chipstore.writer import ChipStoreWriter
from tiling.chipstore.zarrstore import zarr_store
from tiling.errors import SourceChangedError, StoreError, StoreExistsError
from tiling.runtime.fingerprint import Fingerprint
from tiling.runtime.urls import is_local, local_path, storage_errors
from tiling.sources.classes import IDENTITY, ClassMap

logger = logging.getLogger(__name__)

# Every TileConfig field is in one of the two (tests/tiling/chipstore/test_resume.py).
TILE_RERUN_MAY_CHANGE = ("out", "workers", "storage_options", "overwrite")
TILE_RERUN_MUST_MATCH = (
    "images",
    "labels",
    "chip_size",
    "stride",
    "shard_size",
    "min_valid",
    "class_map",
    "num_classes",
    "val_fraction",
    "split_block_chips",
    "compression_level",
    "zero_is_nodata",
)


def open_writer(
    url: str,
    params: StoreParams,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    fingerprints: Mapping[str, Fingerprint] | None = None,
) -> ChipStoreWriter:
    """Create a store at `url`, or resume the incomplete store there written with `params`.

    Refuses (StoreExistsError) a complete store, one written with other parameters or an
    older format, and anything that is not a chip store, unless `overwrite` (never for a
    non-store directory). `fingerprints` (path → now) of the inputs: a resume refuses
    (SourceChangedError) a done source or a label raster whose file changed since.
    """
    _refuse_foreign_local_directory(url)
    store = zarr_store(url, storage_options=storage_options)
    with storage_errors(url):
        try:
            group: zarr.Group | None = zarr.open_group(store, mode="r+")
        except FileNotFoundError:
            group = None
    current = dict(fingerprints or {})
    labels_now = {p: current[p] for p in params.labels if p in current}
    if group is not None and not overwrite:
        resumed = _resume(url, group, params, current, labels_now)
        if resumed is not None:
            return resumed
    with storage_errors(url), _unwritable(url):
        group = zarr.open_group(store, mode="w")
    writer = ChipStoreWriter(url, group, params, [])
    writer.write_attrs()  # first, so a crash before the arrays exist still resumes
    with storage_errors(url):
        create_source_table(group, params, labels_now)
        create_arrays(group, params)
    return writer


def check_done_sources(writer: ChipStoreWriter, planned: Mapping[int, str]) -> None:
    """A resumed store's done sources must be the planned sources (id → path) of the same ids."""
    for record in writer.done_sources:
        if planned.get(record.id) != record.path:
            raise StoreError(
                f"{writer.url}: source {record.id} was {record.path} when tiled but is now "
                f"{planned.get(record.id, 'absent')}; pass --overwrite to rebuild the store"
            )


def _resume(
    url: str,
    group: zarr.Group,
    params: StoreParams,
    fingerprints: Mapping[str, Fingerprint],
    labels_now: Mapping[str, Fingerprint],
) -> ChipStoreWriter | None:
    attrs: dict[str, Any] = dict(group.attrs)
    found = chip_store_meta(attrs)
    if found is None:
        raise StoreExistsError(
            f"{url} exists and is not a landcover chip store; "
            "pass --overwrite to replace it or choose another --out"
        )
    meta, version = found
    if version < FORMAT_VERSION:
        raise StoreExistsError(
            f"{url} exists and was written by an older landcover (chip store format version "
            f"{version}, now {FORMAT_VERSION}); pass --overwrite to rebuild it"
        )
    with storage_errors(url):
        _, summary = read_summary(group, url)  # refuses a newer format version
        # no table: the run died before creating the arrays, so nothing was tiled
        table = has_source_table(group)
        recorded_labels = read_label_fingerprints(group, url) if table else dict(labels_now)
        stored_params = read_params(group, url) if table else None
    if not summary.complete:
        _refuse_changed_inputs(url, summary.sources, recorded_labels, fingerprints)
    if stored_params is not None:
        diffs = differences(stored_params, params.to_json())
    else:  # nothing was tiled; only the digest of the options is recorded
        diffs = ["the options differ"] if meta.get("params_sha256") != params.digest() else []
    if not diffs:
        diffs = _class_table_change(summary.class_map, params.class_map)
    if diffs:
        raise StoreExistsError(
            f"{url} exists and was written with other options ({'; '.join(diffs[:3])}); "
            "rerun the original command to resume it, or pass --overwrite to replace it, or "
            "choose another --out"
        )
    if summary.complete:
        raise StoreExistsError(
            f"{url} exists and is complete ({summary.num_chips} chips from "
            f"{len(summary.sources)} sources); pass --overwrite to rebuild it "
            "or choose another --out"
        )
    sources = list(summary.sources)
    logger.info("%s: resuming after %d done sources", url, len(sources))
    with storage_errors(url):
        if not table:
            create_source_table(group, params, labels_now)
        for name in ARRAY_NAMES:
            if name == "labels" and not params.has_labels:
                continue
            try:
                array(group, name, url)
            except StoreError:  # a crash between creating the group and its arrays
                create_arrays(group, params)
                break
    writer = ChipStoreWriter(url, group, params, sources)
    writer.truncate_to_done()
    return writer


def _class_table_change(stored: ClassMap | None, wanted: ClassMap | None) -> list[str]:
    """The class table of the store against the one a rerun would label with, when their names
    agree (`StoreParams` records the name only): `--num-classes` of an identity map, or a
    named table that another landcover defines otherwise."""
    if stored is None or wanted is None or stored.to_json() == wanted.to_json():
        return []
    if stored.name == IDENTITY:
        return [f"num_classes {stored.num_classes} (now {wanted.num_classes})"]
    return [f"class_map {stored.name}: its class table differs from the store's"]


def _refuse_changed_inputs(
    url: str,
    done: tuple[SourceRecord, ...],
    recorded_labels: Mapping[str, Fingerprint],
    now: Mapping[str, Fingerprint],
) -> None:
    """SourceChangedError naming the first input that differs from when it was tiled.

    Runs before the options are compared: a changed file changes the plan too, and
    "changed since it was tiled" is the message that says what happened.
    """
    recorded = [(s.path, s.fingerprint) for s in done] + sorted(recorded_labels.items())
    for path, then in recorded:
        if then is None or path not in now:
            continue
        changes = then.differences(now[path])
        if changes:
            raise SourceChangedError(
                f"{path} changed since it was tiled into {url} ({', '.join(changes)}); its "
                "chips would be stale: pass --overwrite to rebuild the store"
            )


@contextmanager
def _unwritable(url: str) -> Iterator[None]:
    """A local --out that cannot be created: one line naming it, not a traceback."""
    try:
        yield
    except OSError as exc:
        if not is_local(url):
            raise
        reason = exc.strerror or type(exc).__name__
        raise StoreError(
            f"{url}: cannot create the store there ({reason}); choose another --out"
        ) from None


def _refuse_foreign_local_directory(url: str) -> None:
    """Never clear a local directory that holds something other than a zarr store."""
    if not is_local(url):
        return
    path = local_path(url)
    if path.is_file():
        raise StoreExistsError(f"{url} is a file; choose another --out")
    if path.is_dir() and any(path.iterdir()) and not (path / "zarr.json").is_file():
        raise StoreExistsError(
            f"{url} is a non-empty directory that is not a chip store; "
            "choose another --out (it is never overwritten)"
        )
