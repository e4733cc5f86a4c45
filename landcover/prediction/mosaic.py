"""Reading source rasters onto any rectangle of an output grid.

`read_mosaic` fills one rectangle of the grid from the sources that cover it, first source
wins where they overlap. Pixels come from `tiling.sources.reader.RasterReader` (validity from nodata
or an internal mask, never from an alpha band). Sources on the same grid (within
`tiling.sources.grid.GRID_TOLERANCE_PX`) are copied as they are; the others are warped from that
numpy window, so GDAL never sees a band's colour interpretation: NAIP files whose NIR band is
tagged ALPHA keep NIR as data.

Warped pixels are made cell by cell on a fixed lattice of the output grid (`WARP_CELL_PX`),
each cell from the source window it alone decides, and cut out of the cells: GDAL's
approximate transformer (rasterio's `reproject` always uses one, 0.125 px error) fits its
piecewise-linear pieces over the rectangle it is asked for, so a pixel warped as part of
another rectangle could come out differently. On the lattice a pixel has the same inputs
whichever window, block, tile or rank asks for it. A few cells per reader are kept
(`_CellCache`): neighbouring blocks share the cells along their edge.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.errors
import rasterio.windows
from affine import Affine
from rasterio.enums import Resampling
from rasterio.warp import reproject, transform_bounds
from rasterio.windows import from_bounds as window_from_bounds
from shapely.geometry import box

from landcover.prediction.gridwindow import Window
from landcover.prediction.outgrid import GridPlan, OutputGrid, metres_per_unit
from tiling.errors import SourceFormatError
from tiling.runtime.gdal import gdal_reason, open_failed
from tiling.sources.grid import aligned_offset
from tiling.sources.rasters import RasterInfo
from tiling.sources.reader import RasterReader

__all__ = ["WARP_CELL_PX", "GridRect", "Pixels", "read_mosaic", "read_source_onto", "warp_cells"]

# Extra source pixels read around a warped window, for the resampling kernel.
_WARP_MARGIN_PX = 3
# The edge of the lattice cells warped whole, in output pixels (cells start at multiples of it
# from the grid's origin): small enough that the cells past a block's edge cost little, large
# enough that GDAL's per-call set-up does not dominate.
WARP_CELL_PX = 256
# The warped cells one reader keeps, in bytes: the cells along one block's edge, for the next;
# and in number (cells a source does not cover are kept as None, of no size).
_CELL_CACHE_BYTES = 32 * 1024 * 1024
_CELL_CACHE_ENTRIES = 1024

# (bands, height, width) values and the (height, width) mask of the pixels with data
Pixels = tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]


@dataclass(frozen=True, slots=True)
class GridRect:
    """A window of an output grid; it may extend past the grid."""

    grid: OutputGrid
    window: Window

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        return self.grid.bounds_of(self.window)

    @property
    def transform(self) -> Affine:
        return self.grid.window_transform(self.window.row, self.window.col)


def read_mosaic(plan: GridPlan, reader: RasterReader, window: Window) -> Pixels:
    """Pixels of `window` (may extend past the grid) from the sources, first one wins.

    Returns (bands, height, width) values and a (height, width) mask of the pixels a source
    covers with data. Imagery is warped with `average` where the source is finer than the
    grid and `bilinear` where it is coarser.
    """
    rect = GridRect(plan.grid, window)
    area = box(*rect.bounds)
    bands = max(s.count for s in plan.sources)
    data = np.zeros((bands, window.height, window.width), dtype=np.uint8)
    valid = np.zeros((window.height, window.width), dtype=bool)
    for i in plan.sources_touching(area):
        if valid.all():
            break
        got = read_source_onto(reader, plan.sources[i], rect)
        if got is None:
            continue
        values, covered = got
        fill = covered & ~valid
        np.copyto(data[: values.shape[0]], values, where=fill)  # no copy of the picked pixels
        valid |= fill
    return data, valid


def read_source_onto(reader: RasterReader, source: RasterInfo, rect: GridRect) -> Pixels | None:
    """One source's pixels on a rectangle of the output grid, with the mask of pixels it covers."""
    offset = _aligned_offset(source, rect.grid)
    if offset is not None:
        return _read_aligned(reader, source, offset, rect)
    return _read_warped(reader, source, rect)


def _read_aligned(
    reader: RasterReader, source: RasterInfo, offset: tuple[int, int], rect: GridRect
) -> Pixels | None:
    height, width = rect.window.height, rect.window.width
    src_row0 = rect.window.row + offset[0]
    src_col0 = rect.window.col + offset[1]
    r0, r1 = max(src_row0, 0), min(src_row0 + height, source.height)
    c0, c1 = max(src_col0, 0), min(src_col0 + width, source.width)
    if r0 >= r1 or c0 >= c1:
        return None
    block, block_valid = _read_image(
        reader, source, rasterio.windows.Window(c0, r0, c1 - c0, r1 - r0)
    )
    values = np.zeros((source.count, height, width), dtype=np.uint8)
    covered = np.zeros((height, width), dtype=bool)
    dst = (slice(r0 - src_row0, r1 - src_row0), slice(c0 - src_col0, c1 - src_col0))
    values[:, dst[0], dst[1]] = block
    covered[dst] = block_valid
    return values, covered


def _read_warped(reader: RasterReader, source: RasterInfo, rect: GridRect) -> Pixels | None:
    """`source` warped onto `rect`, cut out of the lattice cells that cover it."""
    window = rect.window
    values = np.zeros((source.count, window.height, window.width), dtype=np.uint8)
    covered = np.zeros((window.height, window.width), dtype=bool)
    cells = _CellCache.of(reader)
    for cell in warp_cells(window):
        got = cells.get(source, rect.grid, cell)
        if got is None:
            continue
        part = _intersection(cell, window)
        inside, there = part.slices(window), part.slices(cell)
        values[:, inside[0], inside[1]] = got[0][:, there[0], there[1]]
        covered[inside] = got[1][there]
    if not covered.any():
        return None
    return values, covered


def warp_cells(window: Window) -> list[Window]:
    """The cells of the warp lattice (`WARP_CELL_PX`, from the grid's origin) that `window`
    touches, row by row."""
    size = WARP_CELL_PX
    rows = range(window.row // size, -(-window.row_stop // size))
    cols = range(window.col // size, -(-window.col_stop // size))
    return [Window(r * size, c * size, size, size) for r in rows for c in cols]


def _intersection(a: Window, b: Window) -> Window:
    row, col = max(a.row, b.row), max(a.col, b.col)
    return Window(row, col, min(a.row_stop, b.row_stop) - row, min(a.col_stop, b.col_stop) - col)


class _CellCache:
    """The warped cells one reader made last, up to `_CELL_CACHE_BYTES` and
    `_CELL_CACHE_ENTRIES` (least recently used first out); one per reader, so a cell is never
    taken from another run's files."""

    def __init__(self, reader: RasterReader) -> None:
        self._reader = weakref.ref(reader)
        self._cells: OrderedDict[tuple[Any, ...], Pixels | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, reader: RasterReader) -> _CellCache:
        """The cache of `reader`'s cells (made on first use, gone with the reader)."""
        with _CELL_CACHES_LOCK:
            cache = _CELL_CACHES.get(reader)
            if cache is None:
                cache = _CELL_CACHES[reader] = cls(reader)
            return cache

    def get(self, source: RasterInfo, grid: OutputGrid, cell: Window) -> Pixels | None:
        """The pixels of `source` warped onto `cell` of `grid` (None: it covers none)."""
        key = (source, grid, cell)
        with self._lock:
            if key in self._cells:
                self._cells.move_to_end(key)
                return self._cells[key]
        reader = self._reader()
        assert reader is not None  # the reader asking is alive
        got = _warp_rect(reader, source, GridRect(grid, cell))
        with self._lock:
            if key not in self._cells:
                self._cells[key] = got
                self._bytes += _pixels_bytes(got)
            while len(self._cells) > 1 and (
                self._bytes > _CELL_CACHE_BYTES or len(self._cells) > _CELL_CACHE_ENTRIES
            ):
                _, old = self._cells.popitem(last=False)
                self._bytes -= _pixels_bytes(old)
        return got


_CELL_CACHES: weakref.WeakKeyDictionary[RasterReader, _CellCache] = weakref.WeakKeyDictionary()
_CELL_CACHES_LOCK = threading.Lock()


def _pixels_bytes(pixels: Pixels | None) -> int:
    return 0 if pixels is None else pixels[0].nbytes + pixels[1].nbytes


def _warp_rect(reader: RasterReader, source: RasterInfo, rect: GridRect) -> Pixels | None:
    """`source` warped onto `rect` by one call of GDAL's warper."""
    grid, height, width = rect.grid, rect.window.height, rect.window.width
    try:
        src_bounds = transform_bounds(grid.crs, source.crs, *rect.bounds, densify_pts=21)
    except Exception:  # the rectangle reaches outside the source CRS's domain
        return None
    if not all(math.isfinite(v) for v in src_bounds):
        return None
    win = window_from_bounds(*src_bounds, transform=source.transform)
    r0 = max(math.floor(win.row_off) - _WARP_MARGIN_PX, 0)
    c0 = max(math.floor(win.col_off) - _WARP_MARGIN_PX, 0)
    r1 = min(math.ceil(win.row_off + win.height) + _WARP_MARGIN_PX, source.height)
    c1 = min(math.ceil(win.col_off + win.width) + _WARP_MARGIN_PX, source.width)
    if r0 >= r1 or c0 >= c1:
        return None
    src_window = rasterio.windows.Window(c0, r0, c1 - c0, r1 - r0)
    block, block_valid = _read_image(reader, source, src_window)
    common: dict[str, Any] = {
        "src_transform": source.transform @ Affine.translation(c0, r0),
        "src_crs": source.crs,
        "dst_transform": rect.transform,
        "dst_crs": grid.crs,
    }
    values = np.zeros((source.count, height, width), dtype=np.uint8)
    # Invalid source pixels (collars) must not bleed into the kernels: mark them with a
    # nodata value the warper skips. Coverage is decided by the mask warped below.
    nodata = None if block_valid.all() else 0
    if nodata is not None:
        block = block.copy()
        block[:, ~block_valid] = nodata
    reproject(
        block,
        values,
        src_nodata=nodata,
        dst_nodata=nodata,
        resampling=_resampling(source, grid),
        **common,
    )
    # Coverage is warped separately with nearest neighbour: 1 = a source pixel with data.
    mask = np.zeros((height, width), dtype=np.uint8)
    reproject(
        block_valid.astype(np.uint8),
        mask,
        src_nodata=None,
        dst_nodata=None,
        resampling=Resampling.nearest,
        **common,
    )
    covered = mask.astype(bool)
    if not covered.any():
        return None
    return values, covered


def _read_image(
    reader: RasterReader, source: RasterInfo, window: rasterio.windows.Window
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """`reader.read_image`, with a failed read named as the damaged file it almost always is.

    A file cut short (an interrupted download or copy) opens fine, since its header comes
    first, and fails only when a window reaches the missing bytes.
    """
    try:
        return reader.read_image(source, window)
    except rasterio.errors.RasterioIOError as exc:
        reason = gdal_reason(exc)
        if open_failed(exc):
            # a file the source refers to (a VRT's member) is missing or unreadable: that is
            # no property of the window, so the line is the same whichever unit meets it
            raise SourceFormatError(
                f"{source.path}: cannot open a file it refers to ({reason}); restore that "
                "file, or rebuild the VRT without it"
            ) from None
        raise SourceFormatError(
            f"{source.path}: reading rows {window.row_off}..{window.row_off + window.height} "
            f"failed ({reason}): the file is truncated or corrupt; re-download it or leave it "
            "out"
        ) from None


def _resampling(source: RasterInfo, grid: OutputGrid) -> Resampling:
    src_m = source.resolution_m
    dst_m = grid.resolution * metres_per_unit(grid.crs)
    return Resampling.average if src_m < dst_m * (1 - 1e-6) else Resampling.bilinear


def _aligned_offset(source: RasterInfo, grid: OutputGrid) -> tuple[int, int] | None:
    """(rows, cols) from grid pixels to source pixels when the grids agree, else None."""
    if source.crs != grid.crs:
        return None
    span_px = max(source.width, source.height)
    return aligned_offset(grid.transform, source.transform, span_px=span_px)
