"""Reading a chip store: `open_store`, the `ChipStore` read API, and loading one rank's share
of it into RAM (`assign_chips_to_ranks`, `shard_bytes`, `load_shard_into_memory`).

This is the contract between tiling and training (docs/CONTRACTS.md); the format itself (the
arrays, the `landcover_chips` attribute, `StoreSummary`) is defined in
`tiling.chipstore.store_format` and its public names are re-exported here; the per-source records
are read by `tiling.chipstore.source_table`. Every read checks what it reads
(`tiling.chipstore.shard_reader`): a lost or altered shard object is a `StoreCorruptError`, never
zeros or wrong pixels. Writing lives in `tiling.chipstore.writer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import zarr

from tiling.chipstore.records import (
    BANDS,
    NUM_BANDS,
    STATE_DONE,
    STATE_WRITING,
    BandStats,
    SourceRecord,
)
from tiling.chipstore.shard_reader import ShardReader, StoreLayout, chunk_counts, missing_objects
from tiling.chipstore.source_table import read_summary
from tiling.chipstore.store_format import (
    ATTRS_KEY,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_COLUMNS,
    SPLIT_CODES,
    SPLIT_TRAIN,
    SPLIT_VAL,
    Split,
    StoreSummary,
    array,
)
from tiling.chipstore.zarrstore import zarr_store
from tiling.errors import StoreError
from tiling.runtime.urls import storage_errors

__all__ = [
    "ATTRS_KEY",
    "BANDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_COLUMNS",
    "NUM_BANDS",
    "SPLIT_TRAIN",
    "SPLIT_VAL",
    "STATE_DONE",
    "STATE_WRITING",
    "BandStats",
    "ChipStore",
    "InMemoryShard",
    "SourceRecord",
    "StoreSummary",
    "assign_chips_to_ranks",
    "load_shard_into_memory",
    "open_store",
    "shard_bytes",
]

logger = logging.getLogger(__name__)

# Decoded bytes fetched per batch when loading: large enough for many concurrent shard
# requests, small enough that the compressed copies in flight stay well below the chips.
READ_BATCH_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class InMemoryShard:
    """One rank's chips, decoded into RAM."""

    images: npt.NDArray[np.uint8]  # (n, 4, C, C)
    labels: npt.NDArray[np.uint8] | None  # (n, C, C), None for an images-only store
    chip_ids: npt.NDArray[np.int64]  # (n,) rows of the store, sorted
    load_time_s: float
    bytes_read: int  # stored (compressed) bytes of the shard objects fetched

    @property
    def nbytes(self) -> int:
        labels = 0 if self.labels is None else self.labels.nbytes
        return int(self.images.nbytes + labels + self.chip_ids.nbytes)


class ChipStore:
    """A chip store opened for reading. Only chips of done sources are visible."""

    def __init__(self, url: str, group: zarr.Group, summary: StoreSummary) -> None:
        self.url = url
        self.summary = summary
        self._group = group
        self._index: npt.NDArray[np.int32] | None = None
        self._reader = ShardReader(_layout(url, group, summary))

    def __repr__(self) -> str:
        return f"ChipStore({self.url!r}, chips={self.summary.num_chips})"

    def index(self) -> npt.NDArray[np.int32]:
        """(N, 4) int32: source_id, row_px, col_px, split (0 train, 1 val)."""
        if self._index is None:
            self._index = self._reader.read_index()
        return self._index

    def chip_ids(self, split: Split) -> npt.NDArray[np.int64]:
        """Sorted rows of the chips in `split` ("train", "val" or "all")."""
        if split == "all":
            return np.arange(self.summary.num_chips, dtype=np.int64)
        if split not in SPLIT_CODES:
            raise StoreError(f"unknown split {split!r}; use 'train', 'val' or 'all'")
        return np.flatnonzero(self.index()[:, 3] == SPLIT_CODES[split]).astype(np.int64)

    def read_chips(
        self, chip_ids: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None]:
        """Images (n, 4, C, C) and labels (n, C, C) (None if images-only), in `chip_ids` order.

        Reads whole shard objects (one request each) in batches and keeps the wanted chips;
        `StoreCorruptError` if an object they need is missing or fails its checksums.
        """
        images, labels, _ = self._read(np.asarray(chip_ids, dtype=np.int64))
        return images, labels

    def missing_objects(self) -> list[str]:
        """Shard objects the done chips need that the store lacks ("images shard 2 (chips
        128..191)"), from a listing of the arrays: cheap, reads no chip."""
        return missing_objects(self._reader.layout)

    def verify(self) -> None:
        """Read every done chip once and check every checksum; `StoreCorruptError` if any fails.

        Reads the whole store (its compressed size) but holds one batch at a time.
        """
        self.index()
        batch = max(self.summary.shard_size, READ_BATCH_BYTES // max(1, self.summary.chip_bytes))
        for lo in range(0, self.summary.num_chips, batch):
            hi = min(lo + batch, self.summary.num_chips)
            self._read(np.arange(lo, hi, dtype=np.int64))

    def stored_bytes(self) -> int:
        """Bytes the store occupies (all arrays, compressed, including any unfinished tail)."""
        with storage_errors(self.url):
            arrays = [array(self._group, name, self.url) for name in self._array_names()]
            return sum(int(a.nbytes_stored()) for a in arrays)

    def _array_names(self) -> list[str]:
        return ["images", "index", *(["labels"] if self.summary.has_labels else [])]

    def _read(
        self, ids: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None, int]:
        s = self.summary
        if ids.ndim != 1:
            raise StoreError(f"chip_ids must be one-dimensional, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= s.num_chips):
            raise StoreError(
                f"{self.url}: chip ids must be in 0..{s.num_chips - 1}, "
                f"got {int(ids.min())}..{int(ids.max())}"
            )
        return self._reader.read(ids, batch_rows=READ_BATCH_BYTES // max(1, s.chip_bytes))


def _layout(url: str, group: zarr.Group, summary: StoreSummary) -> StoreLayout:
    s = summary
    checked = s.integrity_checked

    def counts(labels: bool) -> npt.NDArray[np.int64] | None:
        if not checked or (labels and not s.has_labels):
            return None
        return chunk_counts(
            s.sources, shard_size=s.shard_size, num_chips=s.num_chips, labels=labels
        )

    return StoreLayout(
        url=url,
        store=group.store,
        prefix=f"{group.path}/" if group.path else "",
        chip_size=s.chip_size,
        shard_size=s.shard_size,
        num_chips=s.num_chips,
        has_labels=s.has_labels,
        checked=checked,
        image_chunks=counts(False),
        label_chunks=counts(True),
    )


def read_rows(arr: zarr.Array[Any], lo: int, hi: int) -> npt.NDArray[Any]:
    """Rows lo..hi of an array along its first axis, as numpy."""
    return np.asarray(arr[lo:hi])


def open_group(
    url: str, *, storage_options: Mapping[str, Any] | None = None, mode: Literal["r", "r+"] = "r"
) -> zarr.Group:
    """The store's zarr group; `StoreError` if there is none."""
    store = zarr_store(url, storage_options=storage_options, read_only=mode == "r")
    with storage_errors(url):
        try:
            return zarr.open_group(store, mode=mode)
        except FileNotFoundError:
            raise StoreError(
                f"{url}: no chip store there; create one with `landcover tile IMAGES --out {url}`"
            ) from None


def open_store(url: str, *, storage_options: Mapping[str, Any] | None = None) -> ChipStore:
    """Open a chip store for reading (any fsspec URL); refuses stores of a newer format.

    A store of a format older than `store_format.FIRST_CHECKED_VERSION` opens with one
    warning: its reads cannot be checked.
    """
    group = open_group(url, storage_options=storage_options)
    _, summary = read_summary(group, url)
    if not summary.integrity_checked:
        logger.warning(
            "%s: chip store format version %d has no checksums, so lost or damaged shard "
            "objects cannot be detected; re-tile it with --overwrite to upgrade",
            url,
            summary.format_version,
        )
    return ChipStore(url, group, summary)


def assign_chips_to_ranks(
    chip_ids: npt.ArrayLike, world_size: int, *, shard_size: int = 1
) -> list[npt.NDArray[np.int64]]:
    """Split chip ids into `world_size` sorted parts whose sizes differ by at most one.

    Whole shard objects (runs of ids with the same id // shard_size) are dealt round-robin
    to the ranks, so every rank samples the whole store (all sources, all regions) while
    reading about 1/world_size of the objects; then the largest parts hand chips from
    their last shard to the smallest until the sizes differ by at most one. Deterministic,
    so every rank computes the same assignment without talking to the others.
    """
    if world_size < 1:
        raise StoreError(f"world_size must be at least 1, got {world_size}")
    if shard_size < 1:
        raise StoreError(f"shard_size must be at least 1, got {shard_size}")
    ids = np.sort(np.asarray(chip_ids, dtype=np.int64).ravel())
    shard_of = ids // shard_size
    starts = np.flatnonzero(np.diff(shard_of)) + 1
    dealt: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(world_size)]
    for g, group in enumerate(np.split(ids, starts) if ids.size else []):
        dealt[g % world_size].append(group)
    parts = [np.concatenate(p) if p else np.empty(0, np.int64) for p in dealt]
    base, extra = divmod(ids.size, world_size)
    # The `extra` ranks that end one chip larger are the largest now: fewest chips move.
    largest_first = sorted(range(world_size), key=lambda r: (-parts[r].size, r))
    target = [base] * world_size
    for r in largest_first[:extra]:
        target[r] += 1
    surplus = [parts[r][target[r] :] for r in range(world_size) if parts[r].size > target[r]]
    pool = np.sort(np.concatenate(surplus)) if surplus else np.empty(0, np.int64)
    taken = 0
    for r in range(world_size):
        if parts[r].size > target[r]:
            parts[r] = parts[r][: target[r]]
        elif parts[r].size < target[r]:
            need = target[r] - parts[r].size
            parts[r] = np.sort(np.concatenate([parts[r], pool[taken : taken + need]]))
            taken += need
    return [p.copy() for p in parts]


def shard_bytes(summary: StoreSummary, *, world_size: int, split: str) -> int:
    """RAM in bytes that the largest rank's in-memory shard of `split` takes."""
    if world_size < 1:
        raise StoreError(f"world_size must be at least 1, got {world_size}")
    if split not in ("train", "val", "all"):
        raise StoreError(f"unknown split {split!r}; use 'train', 'val' or 'all'")
    n = summary.count(split)  # type: ignore[arg-type]
    per_rank = -(-n // world_size)
    return per_rank * (summary.chip_bytes + np.dtype(np.int64).itemsize)


def load_shard_into_memory(
    url: str,
    *,
    rank: int,
    world_size: int,
    split: str,
    storage_options: Mapping[str, Any] | None = None,
) -> InMemoryShard:
    """Read rank `rank`'s share of `split` into RAM once (a few large reads per shard object)."""
    if not 0 <= rank < world_size:
        raise StoreError(f"rank must be in 0..{world_size - 1}, got {rank}")
    start = time.perf_counter()
    store = open_store(url, storage_options=storage_options)
    ids = assign_chips_to_ranks(
        store.chip_ids(split),  # type: ignore[arg-type]
        world_size,
        shard_size=store.summary.shard_size,
    )[rank]
    images, labels, bytes_read = store._read(ids)
    elapsed = time.perf_counter() - start
    logger.info(
        "rank %d/%d: loaded %d %s chips (%.1f MB stored) in %.2f s",
        rank,
        world_size,
        ids.size,
        split,
        bytes_read / 1e6,
        elapsed,
    )
    return InMemoryShard(
        images=images, labels=labels, chip_ids=ids, load_time_s=elapsed, bytes_read=bytes_read
    )
