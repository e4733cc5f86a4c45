"""Reading chips from a store's shard objects: one GET per object, every checksum checked.

zarr alone cannot tell a lost shard object from one that was never written: chunks that
are all zero are not stored, and zarr reads anything absent as zeros. Nor does it check
what it decompresses. So the reader fetches whole objects itself and, for the rows of done
sources (format version 2 on):

- a missing object is an error unless the writer recorded that it holds no stored chunk
  (per-source `image_chunks` / `label_chunks`); index chunks are always stored;
- the shard index must match its crc32c and hold exactly the recorded number of chunks;
- every chunk returned must match its crc32c and decompress to one chip.

Any failure raises `StoreCorruptError` naming the chip range, the object and the fix.
Version 1 stores carry neither checksums nor counts: they are read unchecked.
Decompression runs on a small thread pool (zstd releases the GIL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from tiling.chipstore.records import NUM_BANDS, SourceRecord
from tiling.chipstore.shards import ChunkChecksumError, ChunkDecoder, decode_shard
from tiling.errors import StoreCorruptError, StoreError
from tiling.runtime.machine import local_cpu_count
from tiling.runtime.urls import storage_errors

INDEX_COLUMNS = 4
# Objects requested at once: enough to hide blob-storage latency, few enough that a
# listing-sized burst does not trip the account's throttling.
MAX_REQUESTS_IN_FLIGHT = 256
MAX_DECODE_THREADS = 8


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """Where a store's objects are and what the done rows of each must hold."""

    url: str
    store: Store
    prefix: str  # the group's path inside the zarr store, "" or ending in "/"
    chip_size: int
    shard_size: int
    num_chips: int  # rows of done sources; nothing past them is read
    has_labels: bool
    checked: bool  # format version 2 on: checksums and chunk counts
    # stored chunks per shard object over the done rows (None: not recorded)
    image_chunks: npt.NDArray[np.int64] | None = field(default=None, compare=False)
    label_chunks: npt.NDArray[np.int64] | None = field(default=None, compare=False)

    @property
    def num_shards(self) -> int:
        return -(-self.num_chips // self.shard_size)

    def key(self, name: str, k: int) -> str:
        rest = {"images": "/0/0/0", "labels": "/0/0", "index": "/0"}[name]
        return f"{self.prefix}{name}/c/{k}{rest}"

    def rows_of(self, k: int) -> tuple[int, int]:
        """First and last done row (inclusive) of shard k."""
        lo = k * self.shard_size
        return lo, min(lo + self.shard_size, self.num_chips) - 1

    def damaged(self, name: str, k: int, what: str) -> StoreCorruptError:
        lo, hi = self.rows_of(k)
        return StoreCorruptError(
            f"{self.url}: chips {lo}..{hi} ({name} shard {k}) {what}; the store is damaged, "
            f"re-tile with: landcover tile <the same inputs and options> --out {self.url} "
            "--overwrite"
        )


def chunk_counts(
    sources: Sequence[SourceRecord], *, shard_size: int, num_chips: int, labels: bool
) -> npt.NDArray[np.int64]:
    """Stored chunks per shard object over the done rows, summed from the source records."""
    counts = np.zeros(-(-num_chips // shard_size), dtype=np.int64)
    for s in sources:
        if s.chips == 0:
            continue
        first, last = s.start // shard_size, (s.end - 1) // shard_size
        recorded = s.label_chunks if labels else s.image_chunks
        if len(recorded) != last - first + 1:
            raise StoreError(
                f"source {s.path} records chunk counts for {len(recorded)} shard objects but "
                f"spans {last - first + 1}; the store's attributes are damaged, re-tile it"
            )
        counts[first : last + 1] += np.asarray(recorded, dtype=np.int64)
    return counts


def fetch(layout: StoreLayout, keys: Sequence[str]) -> list[bytes | None]:
    """The bytes of each object (None if absent), MAX_REQUESTS_IN_FLIGHT at a time."""
    prototype = default_buffer_prototype()
    store = layout.store

    async def get(key: str) -> bytes | None:
        value = await store.get(key, prototype=prototype)
        return None if value is None else value.to_bytes()

    async def run(batch: Sequence[str]) -> list[bytes | None]:
        return list(await asyncio.gather(*(get(k) for k in batch)))

    out: list[bytes | None] = []
    with storage_errors(layout.url):
        for i in range(0, len(keys), MAX_REQUESTS_IN_FLIGHT):
            out.extend(sync(run(keys[i : i + MAX_REQUESTS_IN_FLIGHT])))
    return out


def decode_threads() -> int:
    return max(1, min(MAX_DECODE_THREADS, local_cpu_count()))


class ShardReader:
    """Reads rows of done sources from a store laid out as `layout`."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout
        self._decoder = ChunkDecoder(checksum=layout.checked)

    def read_index(self) -> npt.NDArray[np.int32]:
        """(num_chips, 4) int32 rows of the `index` array, each chunk checked."""
        lay = self.layout
        out = np.zeros((lay.num_shards * lay.shard_size, INDEX_COLUMNS), dtype="<i4")
        keys = [lay.key("index", k) for k in range(lay.num_shards)]
        for k, data in enumerate(fetch(lay, keys)):
            block = out[k * lay.shard_size : (k + 1) * lay.shard_size]
            if data is None:
                if lay.checked:  # always stored from version 2 on
                    raise lay.damaged("index", k, "missing: index object not found")
                continue  # version 1: an all-zero chunk is not stored
            try:
                self._decoder.decode_into(data, block)
            except ChunkChecksumError as exc:
                raise lay.damaged("index", k, f"corrupt: {exc}") from None
        return out[: lay.num_chips].astype(np.int32)

    def read(
        self, ids: npt.NDArray[np.int64], *, batch_rows: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None, int]:
        """Images and labels of rows `ids` (any order, repeats allowed), stored bytes read.

        Shard objects are fetched in batches of about `batch_rows` rows, so the compressed
        copies in flight stay small next to the decoded chips.
        """
        lay = self.layout
        c = lay.chip_size
        images = np.empty((ids.size, NUM_BANDS, c, c), dtype=np.uint8)
        labels = np.empty((ids.size, c, c), dtype=np.uint8) if lay.has_labels else None
        if ids.size == 0:
            return images, labels, 0
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        shard_of = sorted_ids // lay.shard_size
        shards = np.unique(shard_of)
        per_batch = max(1, batch_rows // lay.shard_size)
        targets: list[tuple[str, npt.NDArray[np.uint8]]] = [("images", images)]
        if labels is not None:
            targets.append(("labels", labels))
        bytes_read = 0
        with ThreadPoolExecutor(decode_threads(), thread_name_prefix="decode") as pool:
            for b in range(0, shards.size, per_batch):
                batch = [int(k) for k in shards[b : b + per_batch]]
                keys = [lay.key(name, k) for name, _ in targets for k in batch]
                objects = dict(zip(keys, fetch(lay, keys), strict=True))
                bytes_read += sum(len(v) for v in objects.values() if v is not None)
                decoding: list[Future[None]] = []
                for k in batch:
                    lo, hi = np.searchsorted(shard_of, [k, k + 1])
                    rows = sorted_ids[lo:hi] - k * lay.shard_size
                    positions = order[lo:hi]
                    for name, out in targets:
                        data = objects[lay.key(name, k)]
                        decoding.append(
                            pool.submit(self.decode_rows, name, k, data, rows, positions, out)
                        )
                for future in decoding:
                    future.result()
        return images, labels, bytes_read

    def decode_rows(
        self,
        name: str,
        k: int,
        data: bytes | None,
        rows: npt.NDArray[np.int64],
        positions: npt.NDArray[np.int64],
        out: npt.NDArray[np.uint8],
    ) -> None:
        """Decode rows `rows` of shard object k of array `name` into out[positions]."""
        lay = self.layout
        expected = lay.image_chunks if name == "images" else lay.label_chunks
        if data is None:
            if expected is not None and expected[k] > 0:
                raise lay.damaged(name, k, "missing: shard object not found")
            out[positions] = 0  # every chip of it is empty (zarr stores no empty chunk)
            return
        try:
            chunks = decode_shard(data, lay.shard_size)
        except ValueError as exc:
            raise lay.damaged(name, k, f"corrupt: {exc}") from None
        if expected is not None:
            lo, hi = lay.rows_of(k)
            present = sum(chunk is not None for chunk in chunks[: hi - lo + 1])
            if present != expected[k]:
                what = f"corrupt: holds {present} stored chips, the store recorded {expected[k]}"
                raise lay.damaged(name, k, what)
        for row, pos in zip(rows.tolist(), positions.tolist(), strict=True):
            chunk = chunks[row]
            if chunk is None:
                out[pos] = 0
                continue
            try:
                self._decoder.decode_into(chunk, out[pos])
            except ChunkChecksumError as exc:
                chip = k * lay.shard_size + row
                raise lay.damaged(name, k, f"corrupt: chip {chip}: {exc}") from None


def missing_objects(layout: StoreLayout) -> list[str]:
    """Objects that the done rows need but the store lacks, from one listing per array.

    Cheap (no object is read), so `landcover info` runs it every time; it cannot see
    flipped bytes, which only reading (`ChipStore.verify`) finds.
    """
    if not layout.checked or layout.num_chips == 0:
        return []
    listed = _listing(layout)
    problems = []
    for k in range(layout.num_shards):
        lo, hi = layout.rows_of(k)
        wanted = [("index", True), ("images", _needs(layout.image_chunks, k))]
        if layout.has_labels:
            wanted.append(("labels", _needs(layout.label_chunks, k)))
        for name, needed in wanted:
            if needed and layout.key(name, k) not in listed:
                problems.append(f"{name} shard {k} (chips {lo}..{hi})")
    return problems


def _needs(counts: npt.NDArray[np.int64] | None, k: int) -> bool:
    return counts is not None and bool(counts[k] > 0)


def _listing(layout: StoreLayout) -> set[str]:
    async def run() -> set[str]:
        keys: set[str] = set()
        for name in ("images", "labels", "index"):
            async for key in layout.store.list_prefix(f"{layout.prefix}{name}/c/"):
                keys.add(key)
        return keys

    with storage_errors(layout.url):
        return sync(run())
