"""The chip-store format and its read API (the contract between tiling and training).

A chip store is one Zarr v3 group at any fsspec URL (see docs/CONTRACTS.md):

- `images` (N, 4, C, C) uint8 and `labels` (N, C, C) uint8, one chunk per chip, grouped by the
  sharding codec into shard objects of `shard_size` chips: a rank's one-time load is a few
  large sequential reads, not N small ones (blob storage charges per request).
- `index` (N, 4) int32: source id, row/col of the chip in its source (pixels), split.
- group attribute `landcover_chips`: format, version, parameters, band stats, class counts
  and one record per source. A source's `state` turning "done" is the commit point: the
  arrays may be longer than the sum of done sources (a source being appended, or the
  half-written tail of an interrupted run) and readers never look past the done prefix.

Writing lives in `tiling.writer`; this module only reads.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import zarr
from zarr.core.sync import sync

from tiling.classes import ClassMap
from tiling.errors import StoreError
from tiling.urls import storage_errors, zarr_store

logger = logging.getLogger(__name__)

FORMAT_NAME = "landcover-chips"
FORMAT_VERSION = 1
ATTRS_KEY = "landcover_chips"
BANDS: tuple[str, ...] = ("red", "green", "blue", "nir")
NUM_BANDS = len(BANDS)
SPLIT_TRAIN = 0
SPLIT_VAL = 1
SPLIT_CODES: dict[str, int] = {"train": SPLIT_TRAIN, "val": SPLIT_VAL}
INDEX_COLUMNS: tuple[str, ...] = ("source_id", "row_px", "col_px", "split")
STATE_WRITING = "writing"
STATE_DONE = "done"

Split = Literal["train", "val", "all"]

# Decoded bytes read per zarr call when loading: large enough for many concurrent shard
# requests, small enough that the temporary copy stays well below the shard itself.
READ_BATCH_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class BandStats:
    """Exact per-band pixel statistics: integer sums over valid pixels, mean/std derived."""

    sums: tuple[int, ...] = (0,) * NUM_BANDS
    sums_sq: tuple[int, ...] = (0,) * NUM_BANDS
    count: int = 0

    def __add__(self, other: BandStats) -> BandStats:
        return BandStats(
            sums=tuple(a + b for a, b in zip(self.sums, other.sums, strict=True)),
            sums_sq=tuple(a + b for a, b in zip(self.sums_sq, other.sums_sq, strict=True)),
            count=self.count + other.count,
        )

    @property
    def mean(self) -> tuple[float, ...]:
        if self.count == 0:
            return (0.0,) * len(self.sums)
        return tuple(s / self.count for s in self.sums)

    @property
    def std(self) -> tuple[float, ...]:
        if self.count == 0:
            return (1.0,) * len(self.sums)
        # n·Σx² − (Σx)² in exact integers, so no cancellation error before the one division.
        n = self.count
        return tuple(
            math.sqrt((n * sq - s * s) / (n * n))
            for s, sq in zip(self.sums, self.sums_sq, strict=True)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": list(self.mean),
            "std": list(self.std),
            "count": self.count,
            "sum": list(self.sums),
            "sum_sq": list(self.sums_sq),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> BandStats:
        return cls(
            sums=tuple(int(v) for v in obj["sum"]),
            sums_sq=tuple(int(v) for v in obj["sum_sq"]),
            count=int(obj["count"]),
        )


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One tiled image: where it came from, its geo-referencing and its rows in the arrays."""

    id: int
    path: str
    crs: str  # WKT
    transform: tuple[float, float, float, float, float, float]  # Affine a, b, c, d, e, f
    shape: tuple[int, int]  # (height, width) in pixels
    start: int  # first row of this source's chips in the arrays
    chips: int
    state: str  # "writing" | "done"
    train_chips: int = 0
    val_chips: int = 0
    resolution_m: float = 0.0
    nodata: int | None = None
    label_paths: tuple[str, ...] = ()
    band_stats: BandStats = field(default_factory=BandStats)
    class_counts: tuple[int, ...] = ()

    @property
    def end(self) -> int:
        return self.start + self.chips

    @property
    def done(self) -> bool:
        return self.state == STATE_DONE

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "crs": self.crs,
            "transform": list(self.transform),
            "shape": list(self.shape),
            "start": self.start,
            "chips": self.chips,
            "state": self.state,
            "train_chips": self.train_chips,
            "val_chips": self.val_chips,
            "resolution_m": self.resolution_m,
            "nodata": self.nodata,
            "label_paths": list(self.label_paths),
            "band_stats": self.band_stats.to_json(),
            "class_counts": list(self.class_counts),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SourceRecord:
        a, b, c, d, e, f = (float(v) for v in obj["transform"])
        h, w = (int(v) for v in obj["shape"])
        nodata = obj.get("nodata")
        return cls(
            id=int(obj["id"]),
            path=str(obj["path"]),
            crs=str(obj["crs"]),
            transform=(a, b, c, d, e, f),
            shape=(h, w),
            start=int(obj["start"]),
            chips=int(obj["chips"]),
            state=str(obj["state"]),
            train_chips=int(obj.get("train_chips", 0)),
            val_chips=int(obj.get("val_chips", 0)),
            resolution_m=float(obj.get("resolution_m", 0.0)),
            nodata=None if nodata is None else int(nodata),
            label_paths=tuple(str(p) for p in obj.get("label_paths", ())),
            band_stats=BandStats.from_json(obj["band_stats"])
            if "band_stats" in obj
            else BandStats(),
            class_counts=tuple(int(v) for v in obj.get("class_counts", ())),
        )


@dataclass(frozen=True, slots=True)
class StoreSummary:
    """What a reader needs to know about a store; counts cover done sources only."""

    chip_size: int
    stride: int
    shard_size: int
    bands: tuple[str, ...]
    class_map: ClassMap | None
    band_mean: tuple[float, ...]
    band_std: tuple[float, ...]
    band_stats: BandStats
    class_counts: tuple[int, ...]
    resolution_m: float | None
    num_chips: int
    num_train: int
    num_val: int
    has_labels: bool
    sources: tuple[SourceRecord, ...]  # done sources, in input order
    format_version: int
    val_fraction: float
    min_valid: float
    complete: bool  # every planned source is done

    @property
    def chip_bytes(self) -> int:
        """Raw (decoded) bytes of one chip: image plus label."""
        c2 = self.chip_size * self.chip_size
        return NUM_BANDS * c2 + (c2 if self.has_labels else 0)

    def count(self, split: Split) -> int:
        if split == "all":
            return self.num_chips
        return self.num_train if split == "train" else self.num_val


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


def summary_from_attrs(attrs: Mapping[str, Any], *, url: str) -> StoreSummary:
    """Validate the `landcover_chips` attribute and derive the reader's summary."""
    meta = attrs.get(ATTRS_KEY)
    if not isinstance(meta, Mapping) or meta.get("format") != FORMAT_NAME:
        raise StoreError(
            f"{url}: not a landcover chip store (no {ATTRS_KEY!r} attribute); "
            "write one with `landcover tile`"
        )
    version = int(meta.get("version", 0))
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{url}: chip store format version {version} is newer than this landcover "
            f"reads (version {FORMAT_VERSION}); upgrade landcover"
        )
    sources = tuple(SourceRecord.from_json(s) for s in meta.get("sources", ()))
    done = done_prefix(sources)
    stats = sum((s.band_stats for s in done), BandStats())
    class_map_json = meta.get("class_map")
    class_map = ClassMap.from_json(class_map_json) if class_map_json else None
    num_classes = class_map.num_classes if class_map else 0
    class_counts = [0] * num_classes
    for s in done:
        for code, n in enumerate(s.class_counts[:num_classes]):
            class_counts[code] += n
    resolutions = sorted(s.resolution_m for s in done)
    return StoreSummary(
        chip_size=int(meta["chip_size"]),
        stride=int(meta["stride"]),
        shard_size=int(meta["shard_size"]),
        bands=tuple(meta.get("bands", BANDS)),
        class_map=class_map,
        band_mean=stats.mean,
        band_std=stats.std,
        band_stats=stats,
        class_counts=tuple(class_counts),
        resolution_m=resolutions[len(resolutions) // 2] if resolutions else None,
        num_chips=sum(s.chips for s in done),
        num_train=sum(s.train_chips for s in done),
        num_val=sum(s.val_chips for s in done),
        has_labels=bool(meta.get("has_labels", class_map is not None)),
        sources=done,
        format_version=version,
        val_fraction=float(meta.get("val_fraction", 0.0)),
        min_valid=float(meta.get("min_valid", 0.0)),
        complete=bool(meta.get("complete", False)),
    )


def done_prefix(sources: Sequence[SourceRecord]) -> tuple[SourceRecord, ...]:
    """The done sources that precede the first unfinished one: what readers may see."""
    done: list[SourceRecord] = []
    for s in sources:
        if not s.done:
            break
        done.append(s)
    return tuple(done)


class ChipStore:
    """A chip store opened for reading. Only chips of done sources are visible."""

    def __init__(self, url: str, group: zarr.Group, summary: StoreSummary) -> None:
        self.url = url
        self.summary = summary
        self._group = group
        self._index: npt.NDArray[np.int32] | None = None

    def __repr__(self) -> str:
        return f"ChipStore({self.url!r}, chips={self.summary.num_chips})"

    def index(self) -> npt.NDArray[np.int32]:
        """(N, 4) int32: source_id, row_px, col_px, split (0 train, 1 val)."""
        if self._index is None:
            n = self.summary.num_chips
            with storage_errors(self.url):
                data = read_rows(array(self._group, "index", self.url), 0, n).astype(np.int32)
            self._index = data.reshape(n, len(INDEX_COLUMNS))
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

        Reads whole shard objects (one request each) in batches and keeps the wanted chips.
        """
        images, labels, _ = self._read(np.asarray(chip_ids, dtype=np.int64))
        return images, labels

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
        c = s.chip_size
        if ids.ndim != 1:
            raise StoreError(f"chip_ids must be one-dimensional, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= s.num_chips):
            raise StoreError(
                f"{self.url}: chip ids must be in 0..{s.num_chips - 1}, "
                f"got {int(ids.min())}..{int(ids.max())}"
            )
        images = np.empty((ids.size, NUM_BANDS, c, c), dtype=np.uint8)
        labels = np.empty((ids.size, c, c), dtype=np.uint8) if s.has_labels else None
        if ids.size == 0:
            return images, labels, 0
        img_arr = array(self._group, "images", self.url)
        lbl_arr = array(self._group, "labels", self.url) if s.has_labels else None
        rows_total = int(img_arr.shape[0])
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        shards = np.unique(sorted_ids // s.shard_size)
        shards_per_read = max(1, READ_BATCH_BYTES // max(1, s.chip_bytes * s.shard_size))
        bytes_read = 0
        for batch in _batches_of_consecutive(shards, shards_per_read):
            lo = int(batch[0]) * s.shard_size
            # Whole shard objects (up to the array's current end), so zarr fetches each
            # with one request instead of an index read plus one read per chip.
            hi = min((int(batch[-1]) + 1) * s.shard_size, rows_total)
            sel = (sorted_ids >= lo) & (sorted_ids < hi)
            out_pos = order[sel]
            local = sorted_ids[sel] - lo
            with storage_errors(self.url):
                images[out_pos] = read_rows(img_arr, lo, hi)[local]
                if labels is not None and lbl_arr is not None:
                    labels[out_pos] = read_rows(lbl_arr, lo, hi)[local]
            bytes_read += self._stored_shard_bytes([int(k) for k in batch])
        return images, labels, bytes_read

    def _stored_shard_bytes(self, shards: list[int]) -> int:
        store = self._group.store
        prefix = self._group.path + "/" if self._group.path else ""
        keys = [f"{prefix}images/c/{k}/0/0/0" for k in shards]
        if self.summary.has_labels:
            keys += [f"{prefix}labels/c/{k}/0/0" for k in shards]

        async def sizes() -> list[int]:
            async def size(key: str) -> int:
                try:
                    return int(await store.getsize(key))
                except FileNotFoundError:  # all-zero shard: zarr stores nothing
                    return 0

            return list(await asyncio.gather(*(size(k) for k in keys)))

        with storage_errors(self.url):
            return sum(sync(sizes()))


def array(group: zarr.Group, name: str, url: str) -> zarr.Array[Any]:
    """The array `name` of the store's group; `StoreError` if it is missing."""
    try:
        node = group[name]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise StoreError(
            f"{url}: chip store has no {name!r} array; rebuild it with `landcover tile`"
        )
    return node


def read_rows(arr: zarr.Array[Any], lo: int, hi: int) -> npt.NDArray[Any]:
    """Rows lo..hi of an array along its first axis, as numpy."""
    return np.asarray(arr[lo:hi])


def _batches_of_consecutive(
    shards: npt.NDArray[np.int64], max_len: int
) -> list[npt.NDArray[np.int64]]:
    """Split sorted shard numbers into runs of consecutive numbers of at most `max_len`."""
    if shards.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(shards) != 1) + 1
    batches: list[npt.NDArray[np.int64]] = []
    for run in np.split(shards, breaks):
        batches.extend(run[i : i + max_len] for i in range(0, run.size, max_len))
    return batches


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
    """Open a chip store for reading (any fsspec URL); refuses stores of a newer format."""
    group = open_group(url, storage_options=storage_options)
    summary = summary_from_attrs(dict(group.attrs), url=url)
    return ChipStore(url, group, summary)


def assign_chips_to_ranks(chip_ids: npt.ArrayLike, world_size: int) -> list[npt.NDArray[np.int64]]:
    """Split chip ids into `world_size` contiguous runs whose sizes differ by at most one.

    Contiguous in chip order, so each rank touches few shard objects; deterministic, so every
    rank computes the same assignment without talking to the others.
    """
    if world_size < 1:
        raise StoreError(f"world_size must be at least 1, got {world_size}")
    ids = np.sort(np.asarray(chip_ids, dtype=np.int64).ravel())
    return [part.copy() for part in np.array_split(ids, world_size)]


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
    ids = assign_chips_to_ranks(store.chip_ids(split), world_size)[rank]  # type: ignore[arg-type]
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
