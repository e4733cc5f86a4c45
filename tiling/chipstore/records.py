"""Typed records of a chip store's metadata, shared by writer and reader.

`BandStats` keeps exact integer sums so that per-source statistics add up to the store's
(in the `landcover_chips` attribute) without rounding; `SourceRecord` is one tiled image, its
place in the arrays and what is needed to check it later (fingerprint of the file, stored
chunks per shard object): an element of the `sources` array (`tiling.chipstore.source_table`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tiling.runtime.fingerprint import Fingerprint
from tiling.sources.bands import BANDS as BANDS
from tiling.sources.bands import NUM_BANDS as NUM_BANDS

STATE_WRITING = "writing"
STATE_DONE = "done"


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
    mask_kind: str = ""  # how invalid pixels were told: "nodata" | "internal" | "zero" | "none"
    fingerprint: Fingerprint | None = None  # of the image file when it was tiled
    # Stored (non-empty) chunks of this source in each shard object it touches, shards
    # start // shard_size .. (end - 1) // shard_size: a reader tells a lost object from one
    # that holds only empty chips (which zarr does not store) by these counts.
    image_chunks: tuple[int, ...] = ()
    label_chunks: tuple[int, ...] = ()

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
            "mask_kind": self.mask_kind,
            "fingerprint": self.fingerprint.to_json() if self.fingerprint else None,
            "image_chunks": list(self.image_chunks),
            "label_chunks": list(self.label_chunks),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SourceRecord:
        a, b, c, d, e, f = (float(v) for v in obj["transform"])
        h, w = (int(v) for v in obj["shape"])
        nodata = obj.get("nodata")
        fp = obj.get("fingerprint")
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
            mask_kind=str(obj.get("mask_kind", "")),
            fingerprint=Fingerprint.from_json(fp) if fp else None,
            image_chunks=tuple(int(v) for v in obj.get("image_chunks", ())),
            label_chunks=tuple(int(v) for v in obj.get("label_chunks", ())),
        )
