"""The output grid of a prediction, and reading source rasters onto any part of it.

`plan_output_grid` picks the grid (CRS, pixel size, pixel-aligned extent) for a region;
`read_mosaic` fills one rectangle of that grid from the sources that cover it, first source
wins where they overlap. Pixels come from `tiling.sources.RasterReader` (validity from nodata
or an internal mask, never from an alpha band). Sources on the same grid are copied as they
are; the others are warped from that numpy window, so GDAL never sees a band's colour
interpretation: NAIP files whose NIR band is tagged ALPHA keep NIR as data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.errors
import shapely
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject, transform_bounds
from rasterio.windows import Window
from rasterio.windows import from_bounds as window_from_bounds
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry

from landcover.errors import PredictionError, RegionError
from landcover.prediction.region import Region, reproject_geometry
from tiling.errors import SourceFormatError
from tiling.sources import RasterInfo, RasterReader

# Metadata tags of a land-cover raster: the class table (ClassMap JSON, what `evaluate` reads),
# the class names in code order, and the model architecture.
TAG_CLASS_MAP = "LANDCOVER_CLASS_MAP"
TAG_CLASS_NAMES = "LANDCOVER_CLASS_NAMES"
TAG_MODEL = "LANDCOVER_MODEL"
# Two pixel grids "agree" when their pixel sizes differ by less than this fraction of a pixel
# over the whole source, and their origins by less than this fraction of a pixel.
_ALIGN_TOLERANCE_PX = 1e-3
# Without a region, the union of the images must cover at least this share of its bounding
# grid: images scattered over a continent would otherwise make a continent-sized raster.
_MIN_UNION_COVER = 0.01
# Extra source pixels read around a warped window, for the resampling kernel.
_WARP_MARGIN_PX = 3
# Output grids above this many pixels are refused unless the caller raises the limit: 10
# gigapixels is 100 x 100 km at 1 m (a 10 GB uint8 map before compression, hours of
# inference); a --resolution typo such as 0.0001 m asks for 10^8 times the image's pixels.
DEFAULT_MAX_PIXELS = 10_000_000_000


@dataclass(frozen=True, slots=True)
class OutputGrid:
    """A north-up pixel grid: `transform` maps (col, row) to `crs` coordinates."""

    crs: CRS
    transform: Affine
    width: int
    height: int

    @property
    def resolution(self) -> float:
        return float(self.transform.a)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        left, top = self.transform.c, self.transform.f
        return (
            left,
            top + self.height * self.transform.e,
            left + self.width * self.transform.a,
            top,
        )

    def window_transform(self, row_off: int, col_off: int) -> Affine:
        """Transform of a rectangle of this grid (offsets may lie outside the grid)."""
        return self.transform @ Affine.translation(col_off, row_off)

    def window_bounds(
        self, row_off: int, col_off: int, height: int, width: int
    ) -> tuple[float, float, float, float]:
        left, top = self.transform @ (col_off, row_off)
        right, bottom = self.transform @ (col_off + width, row_off + height)
        return (left, bottom, right, top)


@dataclass(frozen=True, slots=True)
class GridPlan:
    """The grid, the sources that intersect the region (in input order), each source's
    footprint in the grid's CRS, the region in that CRS (None: the union of the sources), and
    `area`, region ∩ footprints: where output pixels can have data."""

    grid: OutputGrid
    sources: tuple[RasterInfo, ...]
    footprints: tuple[BaseGeometry, ...]
    region: BaseGeometry | None
    area: BaseGeometry


def plan_output_grid(
    sources: Sequence[RasterInfo],
    region: Region | None,
    *,
    resolution_m: float,
    crs: CRS | None = None,
    resolution: float | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> GridPlan:
    """The grid for predicting `region` from `sources`.

    CRS: `crs`, else the CRS of the first source that intersects the region. Pixel size:
    `resolution` (in the CRS's units), else `resolution_m` converted to the CRS's units.
    Extent: the bounds of region ∩ union of source footprints, snapped outwards to the pixel
    grid of the first intersecting source that has the same CRS and pixel size (so its pixels
    are read unresampled), else to multiples of the pixel size (like `gdalwarp -tap`).
    A grid of more than `max_pixels` pixels raises `PredictionError` (None: no limit); only
    its size has been computed then, nothing allocated.
    """
    picked = [s for s in sources if region is None or _intersects(region, s)]
    if not picked:
        assert region is not None
        w, s, e, n = region.bounds
        raise RegionError(
            f"region ({w:.6g},{s:.6g},{e:.6g},{n:.6g} in {_crs_name(region.crs)}) is outside "
            f"all {len(sources)} images; check the region, --region-crs and the image paths"
        )
    dst_crs = crs if crs is not None else picked[0].crs
    pixel = (
        resolution if resolution is not None else _resolution_in_crs_units(resolution_m, dst_crs)
    )
    if not (pixel > 0 and math.isfinite(pixel)):
        raise RegionError(f"--resolution {pixel}: must be a positive number")
    footprints = tuple(footprint_in_crs(s, dst_crs) for s in picked)
    coverage = shapely.union_all(footprints)
    region_dst = None if region is None else region.to_crs(dst_crs).geometry
    area = coverage if region_dst is None else coverage.intersection(region_dst)
    if area.is_empty or area.area <= 0:
        raise RegionError(
            "region touches the images only along an edge; give a region that overlaps them"
        )
    anchored = _grid_anchor(picked, dst_crs, pixel)
    anchor_x, anchor_y = anchored if anchored is not None else (0.0, 0.0)
    minx, miny, maxx, maxy = area.bounds
    col0 = _snap(math.floor, (minx - anchor_x) / pixel)
    col1 = _snap(math.ceil, (maxx - anchor_x) / pixel)
    row0 = _snap(math.floor, (anchor_y - maxy) / pixel)
    row1 = _snap(math.ceil, (anchor_y - miny) / pixel)
    left, top = anchor_x + col0 * pixel, anchor_y - row0 * pixel
    if anchored is None:
        # Multiples of the pixel size: drop the float noise (557698.7999999999 → 557698.8),
        # keeping a millionth of a pixel.
        digits = max(0, math.ceil(-math.log10(pixel))) + 6
        left, top = round(left, digits), round(top, digits)
    transform = Affine(pixel, 0.0, left, 0.0, -pixel, top)
    grid = OutputGrid(dst_crs, transform, width=max(col1 - col0, 1), height=max(row1 - row0, 1))
    _check_grid_size(grid, max_pixels)
    if region is None and area.area < _MIN_UNION_COVER * grid.width * grid.height * pixel**2:
        share = area.area / (grid.width * grid.height * pixel**2)
        raise RegionError(
            f"the {len(picked)} images are far apart: they cover {share:.2g} of their bounding "
            f"box in {_crs_name(dst_crs)} ({grid.width} x {grid.height} px); give --region or "
            "--bbox, or predict groups of neighbouring images separately"
        )
    shapely.prepare(area)
    return GridPlan(grid, tuple(picked), footprints, region_dst, area)


def _check_grid_size(grid: OutputGrid, max_pixels: int | None) -> None:
    pixels = grid.width * grid.height
    if max_pixels is None or pixels <= max_pixels:
        return
    raise PredictionError(
        f"output grid {grid.width:,} x {grid.height:,} px = {pixels / 1e9:.3g} gigapixels at "
        f"--resolution {grid.resolution:g} ({_crs_name(grid.crs)} units) is above the limit "
        f"of {max_pixels / 1e9:.3g} gigapixels; use a coarser --resolution or a smaller "
        "region, or raise --max-pixels if you mean it"
    )


def footprint(info: RasterInfo) -> BaseGeometry:
    """A raster's outline in its own CRS (exact for rotated transforms too)."""
    t = info.transform
    corners = [t @ (0, 0), t @ (info.width, 0), t @ (info.width, info.height), t @ (0, info.height)]
    return shapely.Polygon(corners)


def footprint_in_crs(info: RasterInfo, crs: CRS) -> BaseGeometry:
    """A raster's outline in `crs` (edges densified before reprojecting)."""
    outline = footprint(info)
    return outline if info.crs == crs else reproject_geometry(outline, info.crs, crs)


def read_mosaic(
    plan: GridPlan,
    reader: RasterReader,
    row_off: int,
    col_off: int,
    height: int,
    width: int,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Pixels of the rectangle (may extend past the grid) from the sources, first one wins.

    Returns (bands, height, width) values and a (height, width) mask of the pixels a source
    covers with data. Imagery is warped with `average` where the source is finer than the
    grid and `bilinear` where it is coarser.
    """
    rect = box(*plan.grid.window_bounds(row_off, col_off, height, width))
    bands = max(s.count for s in plan.sources)
    data = np.zeros((bands, height, width), dtype=np.uint8)
    valid = np.zeros((height, width), dtype=bool)
    for source, outline in zip(plan.sources, plan.footprints, strict=True):
        if valid.all():
            break
        if not outline.intersects(rect):
            continue
        got = read_source_onto(reader, source, plan.grid, row_off, col_off, height, width)
        if got is None:
            continue
        values, covered = got
        fill = covered & ~valid
        data[: values.shape[0], fill] = values[:, fill]
        valid |= fill
    return data, valid


def read_source_onto(
    reader: RasterReader,
    source: RasterInfo,
    grid: OutputGrid,
    row_off: int,
    col_off: int,
    height: int,
    width: int,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]] | None:
    """One source's pixels on a rectangle of `grid`, with the mask of pixels it covers."""
    offset = _aligned_offset(source, grid)
    if offset is not None:
        return _read_aligned(reader, source, offset, row_off, col_off, height, width)
    return _read_warped(reader, source, grid, row_off, col_off, height, width)


def _read_aligned(
    reader: RasterReader,
    source: RasterInfo,
    offset: tuple[int, int],
    row_off: int,
    col_off: int,
    height: int,
    width: int,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]] | None:
    src_row0 = row_off + offset[0]
    src_col0 = col_off + offset[1]
    r0, r1 = max(src_row0, 0), min(src_row0 + height, source.height)
    c0, c1 = max(src_col0, 0), min(src_col0 + width, source.width)
    if r0 >= r1 or c0 >= c1:
        return None
    block, block_valid = _read_image(reader, source, Window(c0, r0, c1 - c0, r1 - r0))
    values = np.zeros((source.count, height, width), dtype=np.uint8)
    covered = np.zeros((height, width), dtype=bool)
    dst = (slice(r0 - src_row0, r1 - src_row0), slice(c0 - src_col0, c1 - src_col0))
    values[:, dst[0], dst[1]] = block
    covered[dst] = block_valid
    return values, covered


def _read_warped(
    reader: RasterReader,
    source: RasterInfo,
    grid: OutputGrid,
    row_off: int,
    col_off: int,
    height: int,
    width: int,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]] | None:
    dst_bounds = grid.window_bounds(row_off, col_off, height, width)
    try:
        src_bounds = transform_bounds(grid.crs, source.crs, *dst_bounds, densify_pts=21)
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
    src_window = Window(c0, r0, c1 - c0, r1 - r0)
    block, block_valid = _read_image(reader, source, src_window)
    common: dict[str, Any] = {
        "src_transform": source.transform @ Affine.translation(c0, r0),
        "src_crs": source.crs,
        "dst_transform": grid.window_transform(row_off, col_off),
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
    reader: RasterReader, source: RasterInfo, window: Window
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """`reader.read_image`, with a failed read named as the damaged file it almost always is.

    A file cut short (an interrupted download or copy) opens fine, since its header comes
    first, and fails only when a window reaches the missing bytes.
    """
    try:
        return reader.read_image(source, window)
    except rasterio.errors.RasterioIOError as exc:
        raise SourceFormatError(
            f"{source.path}: reading rows {window.row_off}..{window.row_off + window.height} "
            f"failed ({_gdal_reason(exc)}): the file is truncated or corrupt; re-download it "
            "or leave it out"
        ) from None


def _gdal_reason(exc: BaseException) -> str:
    # rasterio's message is "Read failed. See previous exception for details."; GDAL's own
    # text ("Cannot read 8000 bytes at offset ...") is the exception it was raised from.
    cause: BaseException | None = exc
    reason = ""
    while cause is not None:
        text = " ".join(str(cause).split())
        if text:
            reason = text
        cause = cause.__cause__ or cause.__context__
    return reason or type(exc).__name__


def _resampling(source: RasterInfo, grid: OutputGrid) -> Resampling:
    src_m = source.resolution_m
    dst_m = grid.resolution * _unit_factor(grid.crs)
    return Resampling.average if src_m < dst_m * (1 - 1e-6) else Resampling.bilinear


def _unit_factor(crs: CRS) -> float:
    if crs.is_geographic:
        return 111_320.0  # metres per degree at the equator: only to compare pixel sizes
    try:
        return float(crs.linear_units_factor[1])
    except Exception:
        return 1.0


def _resolution_in_crs_units(resolution_m: float, crs: CRS) -> float:
    if crs.is_geographic:
        raise RegionError(
            f"output CRS {_crs_name(crs)} is geographic (degrees); pass --resolution in degrees "
            "or a projected --dst-crs"
        )
    return resolution_m / _unit_factor(crs)


def _aligned_offset(source: RasterInfo, grid: OutputGrid) -> tuple[int, int] | None:
    """(rows, cols) from grid pixels to source pixels when the grids agree, else None."""
    t, g = source.transform, grid.transform
    if source.crs != grid.crs or t.b != 0 or t.d != 0:
        return None
    size = max(source.width, source.height)
    if abs(t.a - g.a) * size > _ALIGN_TOLERANCE_PX * g.a:
        return None
    if abs(t.e - g.e) * size > _ALIGN_TOLERANCE_PX * abs(g.e):
        return None
    cols = (g.c - t.c) / g.a
    rows = (g.f - t.f) / g.e
    if max(abs(cols - round(cols)), abs(rows - round(rows))) > _ALIGN_TOLERANCE_PX:
        return None
    return (round(rows), round(cols))


def _grid_anchor(
    picked: Sequence[RasterInfo], crs: CRS, pixel: float
) -> tuple[float, float] | None:
    for s in picked:
        t = s.transform
        size = max(s.width, s.height)
        if (
            s.crs == crs
            and t.b == 0
            and t.d == 0
            and abs(t.a - pixel) * size <= _ALIGN_TOLERANCE_PX * pixel
            and abs(-t.e - pixel) * size <= _ALIGN_TOLERANCE_PX * pixel
        ):
            return (t.c, t.f)
    return None


def _snap(rounding: Callable[[float], int], value: float) -> int:
    # Values within a thousandth of a pixel of an integer are that integer: bounds that came
    # through a CRS round trip must not grow the grid by a whole pixel.
    nearest = round(value)
    if abs(value - nearest) < _ALIGN_TOLERANCE_PX:
        return int(nearest)
    return int(rounding(value))


def _intersects(region: Region, source: RasterInfo) -> bool:
    try:
        geom = region.to_crs(source.crs).geometry
    except RegionError:
        return False
    overlap = geom.intersection(footprint(source))
    return not overlap.is_empty and overlap.area > 0


def _crs_name(crs: CRS) -> str:
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg else "the given CRS"
