"""Writing a chip store: append one source at a time, commit, cut back after a crash.

Opening a store for writing (create, resume or refuse) lives in `tiling.chipstore.resume`.

One writer appends sources in input order. Appending is atomic from a reader's view: the
arrays grow and the chips and the source's record (`tiling.chipstore.source_table`) are written
first, then the group attribute counts the source (the commit point). Each commit writes the same
few small objects whatever the number of sources before it: the arrays grow by doubling,
so their metadata is rewritten about twenty times in a state's run, and they are cut to
their rows when the store completes. A rerun with the same parameters resumes: done
sources are kept, the half-written tail is cut off, and the shard object that straddles the
cut is re-encoded from the kept chips alone, so the resumed store is byte-for-byte the store
an uninterrupted run writes.

Chips are buffered up to the next shard boundary before they are written, so each shard
object is written whole (one PUT on blob storage) except the last one of a source.

For readers to check what they read, every chunk carries a crc32c, index chunks are always
stored (even all-zero ones), and each source record counts its stored image and label
chunks per shard object.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
import zarr.codecs
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from tiling.chipstore.params import ARRAY_NAMES, StoreParams
from tiling.chipstore.records import BANDS, STATE_DONE, STATE_WRITING, BandStats, SourceRecord
from tiling.chipstore.shard_reader import chunk_counts
from tiling.chipstore.shards import ChunkEncoder, EncodedChunk, decode_shard, encode_shard
from tiling.chipstore.source_table import open_source_table, put_record, trim_records
from tiling.chipstore.store import read_rows
from tiling.chipstore.store_format import (
    ATTRS_KEY,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_COLUMNS,
    StoreSummary,
    array,
    summary_from_meta,
)
from tiling.errors import StoreCorruptError, StoreError
from tiling.runtime.urls import storage_errors

logger = logging.getLogger(__name__)


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
        self,
        url: str,
        group: zarr.Group,
        params: StoreParams,
        sources: list[SourceRecord],
    ) -> None:
        self.url = url
        self.params = params
        self._group = group
        if not all(s.done for s in sources):
            raise StoreError(f"{url}: a writer resumes after done sources only")
        self._sources = sources
        self._params_digest = params.digest()
        # the arrays, opened on first use: this writer alone changes their metadata
        self._arrays: dict[str, zarr.Array[Any]] = {}
        self._table: zarr.Array[Any] | None = None  # the sources array
        # totals of the done sources, kept up to date so a commit does not walk them all
        self._band_stats = BandStats()
        self._source_chips: list[int] = []  # chips of each done source
        self._rows_done = 0
        self._class_counts = [0] * (params.class_map.num_classes if params.class_map else 0)
        self._resolutions: list[float] = []
        for s in sources:
            self._add_to_totals(s)
        # stored (non-empty) chunks of the current source per shard object
        self._stored = {"images": Counter[int](), "labels": Counter[int]()}
        self._rows = sum(s.chips for s in sources)  # rows in written shard objects
        self._current: SourceRecord | None = None
        self._pending = _Pending()
        self._tail = _Pending()  # rows of the last, partial shard already written
        self._encoder = ChunkEncoder(params.compression_level)

    @property
    def done_source_ids(self) -> frozenset[int]:
        return frozenset(s.id for s in self._sources)

    @property
    def done_sources(self) -> tuple[SourceRecord, ...]:
        return tuple(self._sources)

    @property
    def num_chips(self) -> int:
        return self._rows + len(self._pending)

    def begin_source(self, record: SourceRecord) -> None:
        """Start appending `record` (its start/chips/state are set here; nothing is written
        until its chips are: readers never look past the done sources)."""
        if self._current is not None:
            raise StoreError(f"source {self._current.path} is still being written")
        self._current = replace(record, start=self.num_chips, chips=0, state=STATE_WRITING)
        self._stored = {"images": Counter[int](), "labels": Counter[int]()}

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
        first_row, shard = self.num_chips, self.params.shard_size
        for name, chunks in (("images", images), ("labels", labels)):
            for i, chunk in enumerate(chunks):
                if chunk is not None:
                    self._stored[name][(first_row + i) // shard] += 1
        self._pending.images.extend(images)
        self._pending.labels.extend(labels)
        self._pending.index.append(np.asarray(index, dtype=np.int32).reshape(-1, 4))
        shard = self.params.shard_size
        whole = (self._rows + len(self._pending)) // shard * shard - self._rows
        if whole > 0:
            self._flush(whole)

    def skip_placed(
        self, shards: range, image_chunks: Sequence[int], label_chunks: Sequence[int]
    ) -> None:
        """Count whole shard objects `shards` of the current source as written: they were
        built by the rank that cut it and moved into the store (`tiling.tiler.interior`). The
        chips before them must fill the shard before `shards.start` exactly."""
        shard = self.params.shard_size
        if self._current is None:
            raise StoreError("skip_placed() before begin_source()")
        if len(self._pending) or len(self._tail) or self._rows != shards.start * shard:
            raise StoreError(
                f"shards {shards.start}..{shards.stop - 1} do not start at row {self.num_chips}"
            )
        for k, images, labels in zip(
            shards, image_chunks, label_chunks or [0] * len(shards), strict=True
        ):
            self._stored["images"][k] += images
            self._stored["labels"][k] += labels
        self._rows = shards.stop * shard

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
            for name in self._array_names():  # by doubling: rarely a write per commit
                arr = self._array(name)
                if arr.shape[0] < self._rows:
                    arr.resize((max(self._rows, 2 * arr.shape[0]), *arr.shape[1:]))
        start, shard = self._current.start, self.params.shard_size
        shards = range(start // shard, (self._rows - 1) // shard + 1) if self._rows > start else ()
        record = replace(
            self._current,
            chips=self._rows - start,
            state=STATE_DONE,
            band_stats=band_stats,
            class_counts=class_counts,
            train_chips=train_chips,
            val_chips=val_chips,
            image_chunks=tuple(self._stored["images"][k] for k in shards),
            label_chunks=tuple(self._stored["labels"][k] for k in shards)
            if self.params.has_labels
            else (),
        )
        with storage_errors(self.url):
            put_record(self._source_table(), len(self._sources), record)
        self._sources.append(record)
        self._add_to_totals(record)
        self._current = None
        self.write_attrs()
        return record

    def finish(self) -> StoreSummary:
        """Mark the store complete (every planned source done)."""
        if self._current is not None:
            raise StoreError(f"source {self._current.path} was not committed")
        with storage_errors(self.url):
            trim_records(self._source_table(), len(self._sources))
            for name in self._array_names():  # no spare capacity in a complete store
                arr = self._array(name)
                if arr.shape[0] != self._rows:
                    arr.resize((self._rows, *arr.shape[1:]))
        meta = self.write_attrs(complete=True)
        return summary_from_meta(meta, self._sources)

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
            objects[self.object_key("images", k)] = encode_shard(tail_images[lo:hi], shard)
            if self.params.has_labels:
                objects[self.object_key("labels", k)] = encode_shard(tail_labels[lo:hi], shard)
            block = np.zeros((shard, len(INDEX_COLUMNS)), dtype="<i4")
            block[: hi - lo] = tail_index[lo:hi]
            # always stored, so that a missing index object is known to be lost
            objects[self.object_key("index", k)] = self._encoder.encode_any(block, keep_empty=True)
        _put_objects(self._group.store, objects, self.url)
        keep = self._rows % shard
        if keep:
            self._tail.images = tail_images[count - keep :]
            self._tail.labels = tail_labels[count - keep :]
            self._tail.index = [tail_index[count - keep :]]

    def object_key(self, name: str, k: int) -> str:
        """The store key of shard object k of array `name`."""
        prefix = f"{self._group.path}/" if self._group.path else ""
        rest = {"images": "/0/0/0", "labels": "/0/0", "index": "/0"}[name]
        return f"{prefix}{name}/c/{k}{rest}"

    def _array_names(self) -> list[str]:
        return [name for name in ARRAY_NAMES if name != "labels" or self.params.has_labels]

    def _array(self, name: str) -> zarr.Array[Any]:
        if name not in self._arrays:
            self._arrays[name] = array(self._group, name, self.url)
        return self._arrays[name]

    def _source_table(self) -> zarr.Array[Any]:
        if self._table is None:
            self._table = open_source_table(self._group, self.url)
        return self._table

    def _add_to_totals(self, record: SourceRecord) -> None:
        self._source_chips.append(record.chips)
        self._rows_done += record.chips
        self._band_stats += record.band_stats
        for code, n in enumerate(record.class_counts[: len(self._class_counts)]):
            self._class_counts[code] += n
        bisect.insort(self._resolutions, record.resolution_m)

    def _meta(self, *, complete: bool) -> dict[str, Any]:
        p = self.params
        resolutions = self._resolutions
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "chip_size": p.chip_size,
            "stride": p.stride,
            "shard_size": p.shard_size,
            "bands": list(BANDS),
            "class_map": p.class_map.to_json() if p.class_map else None,
            "has_labels": p.has_labels,
            "band_stats": self._band_stats.to_json(),
            "class_counts": list(self._class_counts),
            "resolution_m": resolutions[len(resolutions) // 2] if resolutions else None,
            "val_fraction": p.val_fraction,
            "min_valid": p.min_valid,
            "index_columns": list(INDEX_COLUMNS),
            "num_chips": self._rows_done,
            "complete": complete,
            "params_sha256": self._params_digest,  # the whole params: tiling.chipstore.source_table
            "split": p.split.to_json() if p.split else None,
            "zero_is_nodata": p.zero_is_nodata,
            # the commit point: sources[:len(source_chips)] are done (store_format.done_chips)
            "source_chips": " ".join(map(str, self._source_chips)),
        }

    def write_attrs(self, *, complete: bool = False) -> dict[str, Any]:
        """Write the group attribute for the done sources (the commit point of the last)."""
        meta = self._meta(complete=complete)
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
                self._tail.images = self._kept_chunks("images", boundary, keep)
                if self.params.has_labels:
                    self._tail.labels = self._kept_chunks("labels", boundary, keep)
                index = self._array("index")
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
                arr = self._array(name)
                _delete_objects_from(store, f"{arr.path}/c/", first_gone)
                if arr.shape[0] != rows:
                    logger.info("%s: truncating %s to %d rows", self.url, name, rows)
                    arr.resize((rows, *arr.shape[1:]))

    def _kept_chunks(self, name: str, k: int, keep: int) -> list[EncodedChunk]:
        """The first `keep` chunks of shard object k, checked against the recorded counts:
        they are written back as they are, so a lost or damaged object must not slip through."""
        shard = self.params.shard_size
        expected = chunk_counts(
            self._sources, shard_size=shard, num_chips=self._rows, labels=name == "labels"
        )[k]

        def damaged(what: str) -> StoreCorruptError:
            return StoreCorruptError(
                f"{self.url}: chips {k * shard}..{k * shard + keep - 1} ({name} shard {k}) "
                f"{what}; the store is damaged and cannot be resumed: pass --overwrite to "
                "rebuild it"
            )

        data = _read_object(self._group.store, self.object_key(name, k))
        if data is None:
            if expected:
                raise damaged("missing")
            return [None] * keep  # every kept chip is empty: zarr stores no object
        try:
            chunks = decode_shard(data, shard)[:keep]
        except ValueError as exc:
            raise damaged(f"corrupt ({exc})") from None
        if sum(c is not None for c in chunks) != expected:
            raise damaged(f"corrupt (holds other chips than the {expected} recorded)")
        return chunks


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
