"""The spatial train/val split: blocks on one ground grid, shared by every source.

A chip belongs to the block of a square grid that contains its centre. The grid lives in
one CRS for all sources, so the split is a function of ground position: the same place is
in the same split whatever file it came from (two acquisitions of one footprint, or
overlapping neighbours, never put a place in train for one and val for the other).

Grid CRS: EPSG:6933, WGS 84 / NSIDC EASE-Grid 2.0 Global. It is defined for every
longitude and for latitudes up to ±86° (NAIP spans about 17°–49° N); it is equal-area, so
every block holds the same ground area and a share of blocks is a share of area; and it is
cylindrical, so block edges follow meridians and parallels everywhere (no shear far from a
central meridian, as pseudo-cylindrical equal-area projections have). Its linear unit is
the metre, so the block edge is block_chips × chip_size × resolution in metres. Shapes are
stretched away from ±30° latitude (a block is about 1.2 times taller than wide at 45°),
which a split does not mind.

Membership: each block gets a fixed 64-bit hash of (bx, by), read as a number in [0, 1);
the run's k blocks of lowest hash are validation blocks, k = round(val_fraction × blocks),
at least one and at most all but one when the run has two blocks or more. Stored as the
hash threshold (val when hash < threshold), so membership is independent of input order,
of the worker count and of which file a chip came from. Ranking instead of comparing each
hash with the fraction keeps the share of val blocks at the requested fraction on small
runs: a dozen blocks drawn independently at 0.2 gave a third of the chips to val. The rule
depends on the run's block set, which is known before anything is written; a resume must
arrive at the same threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tiling.errors import TilingError
from tiling.sources.crs import transformer
from tiling.sources.grid import ChipGrid
from tiling.sources.rasters import RasterInfo

SPLIT_CRS = "EPSG:6933"
SPLIT_HASH = "splitmix64"

Block = tuple[int, int]


def block_edge_m(chip_size: int, block_chips: int, resolutions_m: Sequence[float]) -> float:
    """Block edge in metres: block_chips × chip_size × the median resolution, whole metres.

    Rounded so that sub-millimetre differences between sources' pixel sizes (0.5998 m vs
    0.6008 m) do not move the grid.
    """
    if not resolutions_m:
        return float(max(1, block_chips * chip_size))
    ordered = sorted(resolutions_m)
    median = ordered[len(ordered) // 2]
    return float(max(1, round(block_chips * chip_size * median)))


def chip_blocks(image: RasterInfo, grid: ChipGrid, edge_m: float) -> npt.NDArray[np.int64]:
    """(rows, cols, 2) grid blocks (bx, by) holding the centre of each chip of `grid`."""
    half = grid.chip_size / 2
    rows = np.asarray(grid.row_offsets, dtype=np.float64) + half
    cols = np.asarray(grid.col_offsets, dtype=np.float64) + half
    col_px, row_px = np.meshgrid(cols, rows)
    t = image.transform
    xs = t.a * col_px + t.b * row_px + t.c
    ys = t.d * col_px + t.e * row_px + t.f
    to_grid = transformer(image.crs, SPLIT_CRS)
    gx, gy = to_grid.transform(xs, ys)
    gx, gy = np.asarray(gx, dtype=np.float64), np.asarray(gy, dtype=np.float64)
    if not (np.isfinite(gx).all() and np.isfinite(gy).all()):
        raise TilingError(
            f"{image.path}: chip centres fall outside the split grid ({SPLIT_CRS} covers "
            "latitudes 86° S to 86° N); leave the image out or pass --val-fraction 0"
        )
    return np.stack([np.floor(gx / edge_m), np.floor(gy / edge_m)], axis=-1).astype(np.int64)


def block_hash(blocks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """A fixed hash of each block (..., 2) as a number in [0, 1) (splitmix64 finaliser)."""
    b = np.asarray(blocks, dtype=np.int64)
    x = b[..., 0].astype(np.uint64) & np.uint64(0xFFFFFFFF)
    y = b[..., 1].astype(np.uint64) & np.uint64(0xFFFFFFFF)
    z = np.atleast_1d((x << np.uint64(32)) | y) + np.uint64(0x9E3779B97F4A7C15)
    # uint64 arithmetic on arrays wraps modulo 2**64, which is what the mixer wants
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    unit = (z >> np.uint64(11)).astype(np.float64) / float(2**53)
    return unit.reshape(x.shape)


@dataclass(frozen=True, slots=True)
class SplitRule:
    """Which ground blocks are validation blocks (hash < threshold); stored in the attrs."""

    val_fraction: float
    edge_m: float
    threshold: float = 0.0  # 0: no val block
    crs: str = SPLIT_CRS

    def is_val(self, blocks: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Validation membership of each block in `blocks` (..., 2)."""
        return np.asarray(block_hash(blocks) < self.threshold)

    def to_json(self) -> dict[str, Any]:
        return {
            "crs": self.crs,
            "block_m": self.edge_m,
            "hash": SPLIT_HASH,
            "val_fraction": self.val_fraction,
            "threshold": self.threshold,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SplitRule:
        return cls(
            val_fraction=float(obj["val_fraction"]),
            edge_m=float(obj["block_m"]),
            threshold=float(obj["threshold"]),
            crs=str(obj.get("crs", SPLIT_CRS)),
        )


def choose_split(blocks: npt.NDArray[np.int64], *, val_fraction: float, edge_m: float) -> SplitRule:
    """The rule for a run whose chips fall in `blocks` (n, 2), possibly repeated: the
    round(val_fraction × distinct blocks) blocks of lowest hash are val, at least one and at
    most all but one when there are two distinct blocks or more."""
    if not 0.0 <= val_fraction < 1.0 or math.isnan(val_fraction):
        raise TilingError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    distinct = np.unique(np.asarray(blocks, dtype=np.int64).reshape(-1, 2), axis=0)
    n = len(distinct)
    if val_fraction == 0.0 or n < 2:
        return SplitRule(val_fraction=val_fraction, edge_m=edge_m)
    k = min(n - 1, max(1, round(val_fraction * n)))
    ranked = np.sort(block_hash(distinct))
    # Val is hash < threshold: the k lowest. (Two blocks with one 53-bit hash would both
    # stay train; at 2**-53 per pair, no store meets it.)
    return SplitRule(val_fraction=val_fraction, edge_m=edge_m, threshold=float(ranked[k]))
