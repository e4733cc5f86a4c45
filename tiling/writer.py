"""Writing a chip store: create, resume, append one source at a time, commit.

One writer appends sources in input order. Appending is atomic from a reader's view: the
arrays grow and the chips are written first, then the source's state turns "done" in the
group attributes (the commit point). A rerun with the same parameters resumes: done sources
are kept, the half-written tail is cut off, and the shard object that straddles the cut is
re-encoded from the kept chips alone, so the resumed store is byte-for-byte the store an
uninterrupted run writes.

Chips are buffered up to the next shard boundary before they are written, so each shard
object is written whole (one PUT on blob storage) except the last one of a source.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
import zarr.codecs
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from tiling.classes import ClassMap
from tiling.errors import StoreError, StoreExistsError
from tiling.shards import ChunkEncoder, EncodedChunk, decode_shard, encode_shard
from tiling.store import (
    ATTRS_KEY,
    BANDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_COLUMNS,
    NUM_BANDS,
    STATE_DONE,
    STATE_WRITING,
    BandStats,
    SourceRecord,
    StoreSummary,
    array,
    done_prefix,
    read_rows,
    summary_from_attrs,
)
from tiling.urls import is_local, local_path, storage_errors, zarr_store

logger = logging.getLogger(__name__)

ARRAY_NAMES = ("images", "labels", "index")


@dataclass(frozen=True, slots=True)
class StoreParams:
    """Everything that decides a store's content; a resume must match it exactly."""

    chip_size: int
    stride: int
    shard_size: int
    class_map: ClassMap | None  # None: images-only store
    val_fraction: float
    min_valid: float
    split_block_chips: int
    compression_level: int
    images: tuple[str, ...]
    labels: tuple[str, ...]

    @property
    def has_labels(self) -> bool:
        return self.class_map is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "chip_size": self.chip_size,
            "stride": self.stride,
            "shard_size": self.shard_size,
            "class_map": self.class_map.name if self.class_map else None,
            "val_fraction": self.val_fraction,
            "min_valid": self.min_valid,
            "split_block_chips": self.split_block_chips,
            "compression_level": self.compression_level,
            "images": list(self.images),
            "labels": list(self.labels),
        }


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        if a == b:
            continue
        if isinstance(a, list) or isinstance(b, list):
            out.append(f"{key} differ")
        else:
            out.append(f"{key} {a} (now {b})")
    return out


def create_arrays(group: zarr.Group, params: StoreParams) -> None:
    """The empty arrays of a store (also used for scratch copies that re-encode a shard)."""
    c, s = params.chip_size, params.shard_size
    compressors = zarr.codecs.ZstdCodec(level=params.compression_level)
    group.create_array(
        "images",
        shape=(0, NUM_BANDS, c, c),
        chunks=(1, NUM_BANDS, c, c),
        shards=(s, NUM_BANDS, c, c),
        dtype="uint8",
        compressors=compressors,
        fill_value=0,
        dimension_names=("chip", "band", "y", "x"),
        overwrite=True,
    )
    if params.has_labels:
        group.create_array(
            "labels",
            shape=(0, c, c),
            chunks=(1, c, c),
            shards=(s, c, c),
            dtype="uint8",
            compressors=compressors,
            fill_value=0,
            dimension_names=("chip", "y", "x"),
            overwrite=True,
        )
    group.create_array(
        "index",
        shape=(0, len(INDEX_COLUMNS)),
        chunks=(s, len(INDEX_COLUMNS)),
        dtype="int32",
        compressors=compressors,
        fill_value=0,
        dimension_names=("chip", "column"),
        overwrite=True,
    )


@dataclass(slots=True)
class _Pending:
    """Chips of the current source not yet in a written shard, encoded."""

    images: list[EncodedChunk] = field(default_factory=list)
    labels: list[EncodedChunk] = field(default_factory=list)
    index: list[npt.NDArray[np.int32]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images)

    def take(self, n: int) -> tuple[list[EncodedChunk], list[EncodedChunk], npt.NDArray[np.int32]]:
        index = np.concatenate(self.index) if self.index else np.empty((0, 4), np.int32)
        out = (self.images[:n], self.labels[:n], index[:n])
        self.images, self.labels = self.images[n:], self.labels[n:]
        self.index = [index[n:]] if len(index) > n else []
        return out


class ChipStoreWriter:
    """Appends sources to a store in order. Use `open_writer` to create or resume one.

    Rows [tail_start, rows) of the last, partly filled shard are kept in memory (encoded)
    so the next shard write can complete it without reading it back.
    """

    def __init__(
        self, url: str, group: zarr.Group, params: StoreParams, sources: list[SourceRecord]
    ) -> None:
        self.url = url
        self.params = params
        self._group = group
        self._sources = sources
        self._rows = sum(s.chips for s in sources)  # rows in written shard objects
        self._current: SourceRecord | None = None
        self._pending = _Pending()
        self._tail = _Pending()  # rows of the last, partial shard already written
        self._encoder = ChunkEncoder(params.compression_level)

    @property
    def done_source_ids(self) -> frozenset[int]:
        return frozenset(s.id for s in self._sources if s.done)

    @property
    def num_chips(self) -> int:
        return self._rows + len(self._pending)

    def begin_source(self, record: SourceRecord) -> None:
        """Start appending `record` (its start/chips/state are set here)."""
        if self._current is not None:
            raise StoreError(f"source {self._current.path} is still being written")
        self._current = replace(record, start=self.num_chips, chips=0, state=STATE_WRITING)
        self._write_attrs([*self._sources, self._current])

    def append(
        self,
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.uint8] | None,
        index: npt.NDArray[np.int32],
    ) -> None:
        """Queue chips of the current source (compressed here, in the calling thread)."""
        encode = self._encoder.encode
        self.append_encoded(
            [encode(chip) for chip in images],
            [encode(chip) for chip in labels] if labels is not None else [],
            index,
        )

    def append_encoded(
        self,
        images: list[EncodedChunk],
        labels: list[EncodedChunk],
        index: npt.NDArray[np.int32],
    ) -> None:
        """Queue chips already compressed with `ChunkEncoder`; writes shards as they fill."""
        if self._current is None:
            raise StoreError("append() before begin_source()")
        if self.params.has_labels and len(labels) != len(images):
            raise StoreError(f"{len(images)} image chips but {len(labels)} label chips")
        if not images:
            return
        self._pending.images.extend(images)
        self._pending.labels.extend(labels)
        self._pending.index.append(np.asarray(index, dtype=np.int32).reshape(-1, 4))
        shard = self.params.shard_size
        whole = (self._rows + len(self._pending)) // shard * shard - self._rows
        if whole > 0:
            self._flush(whole)

    def commit_source(
        self,
        *,
        band_stats: BandStats,
        class_counts: tuple[int, ...],
        train_chips: int,
        val_chips: int,
    ) -> SourceRecord:
        """Write the remaining chips of the current source, grow the arrays, mark it done."""
        if self._current is None:
            raise StoreError("commit_source() before begin_source()")
        self._flush(len(self._pending))
        with storage_errors(self.url):
            for name in self._array_names():
                arr = array(self._group, name, self.url)
                if arr.shape[0] != self._rows:
                    arr.resize((self._rows, *arr.shape[1:]))
        record = replace(
            self._current,
            chips=self._rows - self._current.start,
            state=STATE_DONE,
            band_stats=band_stats,
            class_counts=class_counts,
            train_chips=train_chips,
            val_chips=val_chips,
        )
        self._sources.append(record)
        self._current = None
        self._write_attrs(self._sources)
        return record

    def finish(self) -> StoreSummary:
        """Mark the store complete (every planned source done)."""
        if self._current is not None:
            raise StoreError(f"source {self._current.path} was not committed")
        meta = self._write_attrs(self._sources, complete=True)
        return summary_from_attrs({ATTRS_KEY: meta}, url=self.url)

    def _flush(self, n: int) -> None:
        """Write shard objects holding the first `n` pending chips after the written rows."""
        if n == 0:
            return
        images, labels, index = self._pending.take(n)
        self._tail.images.extend(images)
        self._tail.labels.extend(labels)
        self._tail.index.append(index)
        self._rows += n
        shard = self.params.shard_size
        first = (self._rows - len(self._tail)) // shard
        count = len(self._tail)
        tail_images, tail_labels, tail_index = self._tail.take(count)
        objects: dict[str, bytes | None] = {}
        for k in range(first, -(-self._rows // shard)):
            lo = (k - first) * shard
            hi = min(lo + shard, count)
            objects[self._key("images", k)] = encode_shard(tail_images[lo:hi], shard)
            if self.params.has_labels:
                objects[self._key("labels", k)] = encode_shard(tail_labels[lo:hi], shard)
            block = np.zeros((shard, len(INDEX_COLUMNS)), dtype="<i4")
            block[: hi - lo] = tail_index[lo:hi]
            objects[self._key("index", k)] = self._encoder.encode_any(block)
        _put_objects(self._group.store, objects, self.url)
        keep = self._rows % shard
        if keep:
            self._tail.images = tail_images[count - keep :]
            self._tail.labels = tail_labels[count - keep :]
            self._tail.index = [tail_index[count - keep :]]

    def _key(self, name: str, k: int) -> str:
        prefix = f"{self._group.path}/" if self._group.path else ""
        rest = {"images": "/0/0/0", "labels": "/0/0", "index": "/0"}[name]
        return f"{prefix}{name}/c/{k}{rest}"

    def _array_names(self) -> list[str]:
        return [name for name in ARRAY_NAMES if name != "labels" or self.params.has_labels]

    def _meta(self, sources: list[SourceRecord], *, complete: bool) -> dict[str, Any]:
        p = self.params
        done = done_prefix(sources)
        stats = sum((s.band_stats for s in done), BandStats())
        num_classes = p.class_map.num_classes if p.class_map else 0
        class_counts = [sum(s.class_counts[k] for s in done) for k in range(num_classes)]
        resolutions = sorted(s.resolution_m for s in done)
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "chip_size": p.chip_size,
            "stride": p.stride,
            "shard_size": p.shard_size,
            "bands": list(BANDS),
            "class_map": p.class_map.to_json() if p.class_map else None,
            "has_labels": p.has_labels,
            "band_stats": stats.to_json(),
            "class_counts": class_counts,
            "resolution_m": resolutions[len(resolutions) // 2] if resolutions else None,
            "val_fraction": p.val_fraction,
            "min_valid": p.min_valid,
            "index_columns": list(INDEX_COLUMNS),
            "num_chips": sum(s.chips for s in done),
            "complete": complete,
            "params": p.to_json(),
            "sources": [s.to_json() for s in sources],
        }

    def _write_attrs(
        self, sources: list[SourceRecord], *, complete: bool = False
    ) -> dict[str, Any]:
        meta = self._meta(sources, complete=complete)
        with storage_errors(self.url):
            self._group.update_attributes({ATTRS_KEY: meta})
        return meta

    def truncate_to_done(self) -> None:
        """Cut the store back to the done sources (after an interruption).

        The shard straddling the cut is rebuilt from its kept chips alone and replaced in one
        PUT, objects past it are deleted, then the arrays shrink: done chips stay readable
        throughout and the result is byte-for-byte what an uninterrupted run has here.
        """
        rows, shard = self._rows, self.params.shard_size
        keep = rows % shard
        boundary = rows // shard
        with storage_errors(self.url):
            store = self._group.store
            if keep:
                images = _read_object(store, self._key("images", boundary))
                self._tail.images = decode_shard(images, shard)[:keep] if images else [None] * keep
                if self.params.has_labels:
                    labels = _read_object(store, self._key("labels", boundary))
                    self._tail.labels = (
                        decode_shard(labels, shard)[:keep] if labels else [None] * keep
                    )
                index = array(self._group, "index", self.url)
                if index.shape[0] < rows:
                    raise StoreError(
                        f"{self.url}: index has {index.shape[0]} rows but done sources need "
                        f"{rows}; the store is damaged, pass --overwrite to rebuild it"
                    )
                self._tail.index = [read_rows(index, boundary * shard, rows).astype(np.int32)]
                # re-put the boundary objects from the kept rows (same code path as a flush)
                self._rows -= keep
                kept = self._tail
                self._tail = _Pending()
                self._pending, pending = kept, self._pending
                self._flush(keep)
                self._pending = pending
            first_gone = -(-rows // shard)
            for name in self._array_names():
                arr = array(self._group, name, self.url)
                _delete_objects_from(store, f"{arr.path}/c/", first_gone)
                if arr.shape[0] != rows:
                    logger.info("%s: truncating %s to %d rows", self.url, name, rows)
                    arr.resize((rows, *arr.shape[1:]))


def _read_object(store: Store, key: str) -> bytes | None:
    async def run() -> bytes | None:
        value = await store.get(key, prototype=default_buffer_prototype())
        return None if value is None else value.to_bytes()

    return sync(run())


def _put_objects(store: Store, objects: Mapping[str, bytes | None], url: str) -> None:
    """PUT (or delete, for None) several objects concurrently."""
    prototype = default_buffer_prototype()

    async def put(key: str, value: bytes | None) -> None:
        if value is None:
            await store.delete(key)
        else:
            await store.set(key, prototype.buffer.from_bytes(value))

    async def run() -> None:
        await asyncio.gather(*(put(k, v) for k, v in objects.items()))

    with storage_errors(url):
        sync(run())


def _delete_objects_from(store: Store, prefix: str, first_gone: int) -> None:
    """Delete chunk objects under `prefix` whose first chunk index is ≥ first_gone."""

    async def run() -> None:
        keys = [key async for key in store.list_prefix(prefix)]
        doomed = []
        for key in keys:
            head = key[len(prefix) :].split("/", 1)[0]
            if head.isdigit() and int(head) >= first_gone:
                doomed.append(store.delete(key))
        await asyncio.gather(*doomed)

    sync(run())


def open_writer(
    url: str,
    params: StoreParams,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> ChipStoreWriter:
    """Create a store at `url`, or resume the incomplete store there written with `params`.

    Refuses (StoreExistsError) a complete store, one written with other parameters and
    anything that is not a chip store, unless `overwrite` (never for a non-store directory).
    """
    _refuse_foreign_local_directory(url)
    store = zarr_store(url, storage_options=storage_options)
    with storage_errors(url):
        try:
            group: zarr.Group | None = zarr.open_group(store, mode="r+")
        except FileNotFoundError:
            group = None
    if group is not None and not overwrite:
        resumed = _resume(url, group, params)
        if resumed is not None:
            return resumed
    with storage_errors(url):
        group = zarr.open_group(store, mode="w")
    writer = ChipStoreWriter(url, group, params, [])
    writer._write_attrs([])  # first, so a crash before the arrays exist still resumes
    with storage_errors(url):
        create_arrays(group, params)
    return writer


def _resume(url: str, group: zarr.Group, params: StoreParams) -> ChipStoreWriter | None:
    attrs: dict[str, Any] = dict(group.attrs)
    meta = attrs.get(ATTRS_KEY)
    if not isinstance(meta, Mapping) or meta.get("format") != FORMAT_NAME:
        raise StoreExistsError(
            f"{url} exists and is not a landcover chip store; "
            "pass --overwrite to replace it or choose another --out"
        )
    summary = summary_from_attrs(attrs, url=url)  # refuses a newer format version
    stored = meta.get("params", {})
    diffs = _differences(stored, params.to_json())
    if diffs:
        raise StoreExistsError(
            f"{url} exists and was written with other options ({'; '.join(diffs[:3])}); "
            "rerun the original command to resume it, or pass --overwrite to replace it"
        )
    if summary.complete:
        raise StoreExistsError(
            f"{url} exists and is complete ({summary.num_chips} chips from "
            f"{len(summary.sources)} sources); pass --overwrite to rebuild it "
            "or choose another --out"
        )
    sources = list(done_prefix([SourceRecord.from_json(s) for s in meta.get("sources", ())]))
    logger.info("%s: resuming after %d done sources", url, len(sources))
    with storage_errors(url):
        for name in ARRAY_NAMES:
            if name == "labels" and not params.has_labels:
                continue
            try:
                array(group, name, url)
            except StoreError:  # a crash between creating the group and its arrays
                create_arrays(group, params)
                break
    writer = ChipStoreWriter(url, group, params, sources)
    writer._write_attrs(sources)  # drop the unfinished source before touching its rows
    writer.truncate_to_done()
    return writer


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
