"""The per-source records of a chip store (format version 3 on): the `sources` array.

The `landcover_chips` group attribute is a store's commit point, rewritten once per source.
In format version 2 it also holds one record per source (~3 KB with its WKT and
fingerprints), so it grows with the sources (~12 MB at a state's 4,000) and each rewrite
costs more than the last (`benchmarks/bench_store_records.py`). From version 3:

- the `sources` array (1-D, variable-length UTF-8, one chunk per element, zstd + crc32c)
  holds one JSON record per done source, in input order. Record k is written once, before
  the attribute that counts it: a record past the count (a run that died between the two
  writes) is never read, and the next run overwrites it;
- the attribute holds `source_chips`, the chips of each done source, whose length is the
  number of done sources: the commit point (`tiling.chipstore.writer`, `store_format.done_chips`);
- what does not change during a run is written once, when the store is created, into the
  array's own attributes: `params` (the options and the list of inputs, which grows with
  the store; the group attribute keeps its SHA-256) and `label_fingerprints`.

The array grows by doubling while a run writes and is cut to the number of sources when the
store completes. Readers fetch the N records in one call, 64 at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from tiling.chipstore.params import StoreParams
from tiling.chipstore.records import SourceRecord
from tiling.chipstore.store_format import (
    ATTRS_KEY,
    FIRST_TABLE_VERSION,
    StoreSummary,
    array,
    done_chips,
    done_prefix,
    store_meta,
    summary_from_meta,
)
from tiling.errors import StoreCorruptError, StoreError
from tiling.runtime.fingerprint import Fingerprint

__all__ = [
    "SOURCES_ARRAY",
    "create_source_table",
    "has_source_table",
    "open_source_table",
    "put_record",
    "read_label_fingerprints",
    "read_params",
    "read_records",
    "read_summary",
    "trim_records",
]

SOURCES_ARRAY = "sources"
FIRST_CAPACITY = 64  # elements; the array doubles from here while a run writes
# Records read at once: on blob storage each is a round trip (zarr's default is 10).
READ_CONCURRENCY = 64
_LABELS_ATTR = "label_fingerprints"
_PARAMS_ATTR = "params"


def create_source_table(
    group: zarr.Group, params: StoreParams, label_fingerprints: Mapping[str, Fingerprint]
) -> None:
    """The empty `sources` array of a new store, with its parameters and the label rasters'
    fingerprints."""
    group.create_array(
        SOURCES_ARRAY,
        shape=(0,),
        chunks=(1,),
        dtype=str,
        fill_value="",
        compressors=(zarr.codecs.ZstdCodec(level=3), zarr.codecs.Crc32cCodec()),
        dimension_names=("source",),
        attributes={
            _PARAMS_ATTR: params.to_json(),
            _LABELS_ATTR: {path: fp.to_json() for path, fp in sorted(label_fingerprints.items())},
        },
        overwrite=True,
    )


def has_source_table(group: zarr.Group) -> bool:
    """Whether the store has its `sources` array (a run that died right after creating the
    group attribute has not)."""
    try:
        return isinstance(group[SOURCES_ARRAY], zarr.Array)
    except KeyError:
        return False


def open_source_table(group: zarr.Group, url: str) -> zarr.Array[Any]:
    """The `sources` array, for `put_record` and `trim_records` (its metadata, with the
    parameters' list of every input, is read once, not per commit)."""
    return _table(group, url)


def put_record(arr: zarr.Array[Any], k: int, record: SourceRecord) -> None:
    """Write record `k` (one object; the array's metadata too when it has to grow)."""
    if k >= arr.shape[0]:
        arr.resize((max(k + 1, 2 * arr.shape[0], FIRST_CAPACITY),))
    arr[k] = json.dumps(record.to_json(), separators=(",", ":"))


def trim_records(arr: zarr.Array[Any], n: int) -> None:
    """Cut the array to its first `n` records (a complete store holds no spare capacity)."""
    if arr.shape[0] != n:
        arr.resize((n,))


def read_records(group: zarr.Group, n: int, url: str) -> tuple[SourceRecord, ...]:
    """The first `n` records, in input order; `StoreCorruptError` if one is lost."""
    if n == 0:
        return ()
    arr = _table(group, url)
    if arr.shape[0] < n:
        raise _damaged(url, f"the {SOURCES_ARRAY!r} array holds {arr.shape[0]} records, not {n}")
    try:
        with zarr.config.set({"async.concurrency": READ_CONCURRENCY}):
            texts = [str(text) for text in np.asarray(arr[:n])]
    except ValueError as exc:  # zarr's crc32c check
        raise _damaged(url, f"the {SOURCES_ARRAY!r} array is unreadable ({exc})") from None
    records = []
    for k, text in enumerate(texts):
        try:
            records.append(SourceRecord.from_json(json.loads(text)))
        except (ValueError, KeyError, TypeError):
            raise _damaged(url, f"source record {k} is missing or unreadable") from None
    return tuple(records)


def read_label_fingerprints(group: zarr.Group, url: str) -> dict[str, Fingerprint]:
    """The label rasters' fingerprints recorded when the store was created."""
    stored = _created_with(group, url, _LABELS_ATTR)
    return {str(path): Fingerprint.from_json(fp) for path, fp in stored.items()}


def read_params(group: zarr.Group, url: str) -> Mapping[str, Any]:
    """The `StoreParams.to_json()` the store was created with."""
    return _created_with(group, url, _PARAMS_ATTR)


def _created_with(group: zarr.Group, url: str, name: str) -> Mapping[str, Any]:
    meta = store_meta(dict(group.attrs), url=url)
    if int(meta.get("version", 0)) < FIRST_TABLE_VERSION:
        stored = meta.get(name, {})
    else:
        stored = _table(group, url).attrs.get(name, {})
    if not isinstance(stored, Mapping):
        raise StoreCorruptError(
            f"{url}: the store's {name!r} is not a mapping; the store is damaged, re-tile "
            f"with: landcover tile <the same inputs and options> --out {url} --overwrite"
        )
    return stored


def read_summary(group: zarr.Group, url: str) -> tuple[Mapping[str, Any], StoreSummary]:
    """The store's `landcover_chips` attribute and its summary, done records included.

    Refuses anything that is not a chip store and stores of a newer format (`StoreError`);
    reads the records of a version 1 or 2 store from the attribute itself.
    """
    meta = store_meta(dict(group.attrs), url=url)
    if int(meta.get("version", 0)) < FIRST_TABLE_VERSION:
        done = done_prefix([SourceRecord.from_json(s) for s in meta.get("sources", ())])
    else:
        try:
            count = len(done_chips(meta))
        except StoreError as exc:
            raise _damaged(url, str(exc)) from None
        done = read_records(group, count, url)
    return meta, summary_from_meta(meta, done)


def _table(group: zarr.Group, url: str) -> zarr.Array[Any]:
    return array(group, SOURCES_ARRAY, url)


def _damaged(url: str, what: str) -> StoreCorruptError:
    return StoreCorruptError(
        f"{url}: {what} (group attribute {ATTRS_KEY!r} counts more done sources); the store "
        "is damaged, re-tile with: landcover tile <the same inputs and options> --out "
        f"{url} --overwrite"
    )
