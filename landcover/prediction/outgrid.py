"""The output grid of a prediction: `plan_output_grid` picks the grid (CRS, pixel size,
pixel-aligned extent) for a region and the sources that cover it; source footprints; the
metadata tags of a land-cover raster. Reading sources onto the grid is in
`landcover.prediction.mosaic`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import shapely
from affine import Affine
from rasterio.crs import CRS
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry

from landcover.errors import PredictionError, RegionError
from landcover.prediction.choices import (
    DEFAULT_MAX_PIXELS,
    RESOLUTION_LIMIT_FACTOR,
    RESOLUTION_WARN_FACTOR,
)
from landcover.prediction.gridwindow import Window
from landcover.prediction.region import Region, reproject_geometry
from tiling.sources.grid import north_up_bounds, same_pixel_size, snap_px
from tiling.sources.rasters import RasterInfo

logger = logging.getLogger(__name__)

# Metadata tags of a land-cover raster: the class table (ClassMap JSON, what `evaluate` reads),
# the class names in code order, and the model architecture.
TAG_CLASS_MAP = "LANDCOVER_CLASS_MAP"
TAG_CLASS_NAMES = "LANDCOVER_CLASS_NAMES"
TAG_MODEL = "LANDCOVER_MODEL"
# The images a map was predicted from (a JSON list; local paths absolute): what `view` shows
# beneath it.
TAG_SOURCES = "LANDCOVER_SOURCES"


def sources_tag(paths: Sequence[str]) -> str:
    """The value of `TAG_SOURCES` for images at `paths`: a JSON list, local paths made
    absolute (a map viewed from another directory still finds its images), URLs as given."""
    return json.dumps([p if "://" in p else os.path.abspath(p) for p in paths])


# Without a region, the union of the images must cover at least this share of its bounding
# grid: images scattered over a continent would otherwise make a continent-sized raster.
_MIN_UNION_COVER = 0.01


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
        """(left, bottom, right, top) in `crs`."""
        return north_up_bounds(self.transform, self.width, self.height)

    @property
    def window(self) -> Window:
        """The whole grid as a window."""
        return Window(0, 0, self.height, self.width)

    def window_transform(self, row_off: int, col_off: int) -> Affine:
        """Transform of a rectangle of this grid (offsets may lie outside the grid)."""
        return self.transform @ Affine.translation(col_off, row_off)

    def window_bounds(
        self, row_off: int, col_off: int, height: int, width: int
    ) -> tuple[float, float, float, float]:
        left, top = self.transform @ (col_off, row_off)
        right, bottom = self.transform @ (col_off + width, row_off + height)
        return (left, bottom, right, top)

    def bounds_of(self, window: Window) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) of `window` in the grid's CRS."""
        return self.window_bounds(window.row, window.col, window.height, window.width)

    def sub(self, window: Window) -> OutputGrid:
        """The grid of `window` alone (the grid of a rank's part file, of a tile's COG)."""
        return OutputGrid(
            self.crs,
            self.window_transform(window.row, window.col),
            width=window.width,
            height=max(window.height, 0),
        )


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
    # The footprints in an STRtree (None: scan them): a window finds the sources under it
    # in O(log N), so a state's thousands of sources cost no more per window than a county's.
    footprint_index: shapely.STRtree | None = field(default=None, compare=False, repr=False)

    def sources_touching(self, geometry: BaseGeometry) -> list[int]:
        """Indices, in the plan's order, of the sources whose footprint intersects `geometry`."""
        if self.footprint_index is None:
            return [i for i, f in enumerate(self.footprints) if f.intersects(geometry)]
        hits = self.footprint_index.query(geometry, predicate="intersects")
        return sorted(int(i) for i in hits)

    def sources_read(self, window: Window, reach_px: int) -> list[str]:
        """Paths, in the plan's order, of the images under `window` and the `reach_px`
        pixels around it (the model windows that reach past its edges)."""
        outline = box(*self.grid.bounds_of(window.grown(reach_px)))
        return [self.sources[i].path for i in self.sources_touching(outline)]


def plan_output_grid(
    sources: Sequence[RasterInfo],
    region: Region | None,
    *,
    resolution_m: float,
    crs: CRS | None = None,
    resolution: float | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    quiet: bool = False,
) -> GridPlan:
    """The grid for predicting `region` from `sources`.

    CRS: `crs`, else the CRS of the first source that intersects the region. Pixel size:
    `resolution` (in the CRS's units), else `resolution_m` converted to the CRS's units.
    Extent: the bounds of region ∩ union of source footprints, snapped outwards to the pixel
    grid of the first intersecting source that has the same CRS and pixel size (so its pixels
    are read unresampled), else to multiples of the pixel size (like `gdalwarp -tap`).
    A grid of more than `max_pixels` pixels raises `PredictionError` (None: no limit); only
    its size has been computed then, nothing allocated. A `resolution` far from the model's
    `resolution_m` is refused or warned about (`check_model_resolution`; `quiet`: no warning,
    for the ranks of a job other than 0, which plan the same grid).
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
    col0 = snap_px(math.floor, (minx - anchor_x) / pixel)
    col1 = snap_px(math.ceil, (maxx - anchor_x) / pixel)
    row0 = snap_px(math.floor, (anchor_y - maxy) / pixel)
    row1 = snap_px(math.ceil, (anchor_y - miny) / pixel)
    left, top = anchor_x + col0 * pixel, anchor_y - row0 * pixel
    if anchored is None:
        # Multiples of the pixel size: drop the float noise (557698.7999999999 → 557698.8),
        # keeping a millionth of a pixel.
        digits = max(0, math.ceil(-math.log10(pixel))) + 6
        left, top = round(left, digits), round(top, digits)
    transform = Affine(pixel, 0.0, left, 0.0, -pixel, top)
    grid = OutputGrid(dst_crs, transform, width=max(col1 - col0, 1), height=max(row1 - row0, 1))
    _check_grid_size(grid, max_pixels)
    if resolution is not None:
        check_model_resolution(resolution, dst_crs, resolution_m, warn=not quiet)
    if region is None and area.area < _MIN_UNION_COVER * grid.width * grid.height * pixel**2:
        share = area.area / (grid.width * grid.height * pixel**2)
        raise RegionError(
            f"the {len(picked)} images are far apart: they cover {share:.2g} of their bounding "
            f"box in {_crs_name(dst_crs)} ({grid.width} x {grid.height} px); give --region or "
            "--bbox, or predict groups of neighbouring images separately"
        )
    shapely.prepare(area)
    return GridPlan(grid, tuple(picked), footprints, region_dst, area, shapely.STRtree(footprints))


def check_model_resolution(resolution: float, crs: CRS, model_m: float, *, warn: bool) -> None:
    """Refuse (`PredictionError`) an output pixel of `resolution` units of `crs` more than
    RESOLUTION_LIMIT_FACTOR times coarser or finer than the `model_m` metres the model was
    trained at, and log a warning (when `warn`) beyond RESOLUTION_WARN_FACTOR. A model of
    unknown resolution (0) is not checked."""
    if model_m <= 0:
        return
    per_unit = metres_per_unit(crs)
    pixel_m = resolution * per_unit
    factor = max(pixel_m / model_m, model_m / pixel_m)
    if factor <= RESOLUTION_WARN_FACTOR:
        return
    coarser = pixel_m > model_m
    said = (
        f"--resolution {resolution:g} ({pixel_m:.3g} m) is {factor:.3g}x "
        f"{'coarser' if coarser else 'finer'} than the {model_m:g} m the model was trained at"
    )
    if factor > RESOLUTION_LIMIT_FACTOR:
        low = model_m / RESOLUTION_LIMIT_FACTOR / per_unit
        high = model_m * RESOLUTION_LIMIT_FACTOR / per_unit
        raise PredictionError(
            f"{said} (more than {RESOLUTION_LIMIT_FACTOR:g}x is refused); give a --resolution "
            f"between {low:.3g} and {high:.3g}{_units(crs)}, or none for the model's own (for a "
            "coarser map, read the COG's overviews)"
        )
    if warn:
        logger.warning(
            "%s: objects look %s than the model learnt them; expect a less accurate map "
            "(more than %gx off is refused)",
            said,
            "smaller" if coarser else "larger",
            RESOLUTION_LIMIT_FACTOR,
        )


def _units(crs: CRS) -> str:
    """The unit of --resolution in `crs`, after a number: " m", " degrees", " US survey foot"."""
    if crs.is_geographic:
        return " degrees"
    unit = crs.linear_units or ""
    return " m" if unit in ("metre", "meter", "") and metres_per_unit(crs) == 1.0 else f" {unit}"


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


def metres_per_unit(crs: CRS) -> float:
    """Metres per unit of `crs` (per degree at the equator for a geographic CRS: only to
    compare pixel sizes)."""
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
    return resolution_m / metres_per_unit(crs)


def _grid_anchor(
    picked: Sequence[RasterInfo], crs: CRS, pixel: float
) -> tuple[float, float] | None:
    for s in picked:
        t = s.transform
        size = max(s.width, s.height)
        if s.crs == crs and same_pixel_size(
            t, Affine(pixel, 0.0, 0.0, 0.0, -pixel, 0.0), span_px=size
        ):
            return (t.c, t.f)
    return None


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
