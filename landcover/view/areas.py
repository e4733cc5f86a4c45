"""The area of each class of a land-cover map, on the ellipsoid: every pixel is counted, in
strips of whole block rows (memory bounded by a strip, whatever the map's size), read by a few
threads (GDAL decompresses blocks without the GIL).

A pixel's area is its area on the ellipsoid of the map's own CRS, never its size in the
CRS's units (a Web Mercator pixel at 39° N covers 0.6 of its nominal square metres):

- in a geographic CRS, each row's pixels are exact cells of latitude and longitude, whose
  area has a closed form on the ellipsoid (through the authalic latitude function q);
- in a projected CRS, the map is cut into cells of up to `MAX_CELL_PX` pixels a side (about
  `CELL_GROUND_M` on the ground, and at most `MAX_CELLS` cells); each cell's corners are
  projected into a cylindrical equal-area projection of the same ellipsoid and datum, the
  cell's area is that quadrilateral's, and each of its pixels gets an equal share.

Codes outside the map's class table are counted too and reported as unknown codes, so the
shares add up to the mapped area, not to the known classes alone.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyproj
import rasterio
from pyproj.crs import ProjectedCRS
from pyproj.crs.coordinate_operation import LambertCylindricalEqualAreaConversion
from rasterio.windows import Window

from landcover.classes import NODATA_CODE
from landcover.view.mapfile import MapFile

__all__ = ["UNKNOWN_COLOR", "CellAreas", "ClassArea", "cell_areas", "class_areas"]

logger = logging.getLogger(__name__)

STRIP_PIXELS = 8 * 1024 * 1024  # pixels per read: 8 MiB of uint8 per thread
WEIGHT_PIXELS = 1024 * 1024  # pixels weighted at once: 8 MiB of float64
READ_THREADS = 4
CELL_GROUND_M = 250.0
MAX_CELL_PX = 256
MAX_CELLS = 1_000_000
UNKNOWN_COLOR = (0, 0, 0)  # the legend's swatch of a code outside the class table


@dataclass(frozen=True, slots=True)
class ClassArea:
    """One code of a map: code, name, colour, pixels counted, area on the ellipsoid and its
    share of the mapped area (every code but nodata). `known` is False for a code outside the
    map's class table (named "unknown code N")."""

    code: int
    name: str
    color: tuple[int, int, int]
    pixels: int
    area_km2: float
    share: float  # 0..1
    known: bool = True


@dataclass(frozen=True, slots=True)
class CellAreas:
    """The area of a pixel, per cell of `rows` x `cols` pixels: `pixel_m2[i, j]` for the
    pixels of rows i*rows.. and columns j*cols.. (the last cells may be smaller)."""

    rows: int
    cols: int
    pixel_m2: npt.NDArray[np.float64]


def class_areas(map_file: MapFile) -> list[ClassArea]:
    """The classes of `map_file`'s table (nodata aside), then any code found outside it, with
    their exact pixel counts and areas on the ellipsoid (see the module docstring)."""
    cells = cell_areas(map_file)
    counts = np.zeros(256, dtype=np.int64)
    area_m2 = np.zeros(256, dtype=np.float64)
    lock = threading.Lock()
    local = threading.local()
    datasets: list[rasterio.io.DatasetReader] = []
    source = map_file.readable

    def count(window: Window) -> None:
        ds = getattr(local, "ds", None)
        if ds is None:  # a GDAL dataset is not shared between threads
            ds = local.ds = rasterio.open(source)
            with lock:
                datasets.append(ds)
        codes = ds.read(1, window=window)
        strip_counts, strip_area = _count_strip(codes, cells, int(window.row_off))
        with lock:
            counts[:] += strip_counts
            area_m2[:] += strip_area

    try:
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            for _ in pool.map(count, _strips(map_file)):
                pass
    finally:
        for ds in datasets:
            ds.close()
    table = {c.code: c for c in map_file.class_map.classes if c.code != NODATA_CODE}
    unknown = [
        int(code) for code in np.flatnonzero(counts) if code != NODATA_CODE and code not in table
    ]
    mapped_m2 = float(sum(area_m2[code] for code in [*table, *unknown]))

    def share(code: int) -> float:
        return float(area_m2[code]) / mapped_m2 if mapped_m2 > 0 else 0.0

    known = [
        ClassArea(
            code=c.code,
            name=c.name,
            color=c.color,
            pixels=int(counts[c.code]),
            area_km2=float(area_m2[c.code]) / 1e6,
            share=share(c.code),
        )
        for c in table.values()
    ]
    return known + [
        ClassArea(
            code=code,
            name=f"unknown code {code}",
            color=UNKNOWN_COLOR,
            pixels=int(counts[code]),
            area_km2=float(area_m2[code]) / 1e6,
            share=share(code),
            known=False,
        )
        for code in unknown
    ]


def cell_areas(map_file: MapFile) -> CellAreas:
    """The area in m² on the ellipsoid of the pixels of `map_file`, per cell (see the module
    docstring). A CRS with no ellipsoid (an engineering CRS) gives the nominal pixel size, with
    a warning."""
    crs = pyproj.CRS.from_user_input(map_file.crs.to_wkt())
    t = map_file.transform
    unit_m = crs.axis_info[0].unit_conversion_factor if crs.axis_info else 1.0
    if crs.geodetic_crs is None:
        logger.warning(
            "%s: its CRS has no ellipsoid; areas are the pixels' nominal size", map_file.given
        )
        flat = np.full((1, 1), abs(t.a * t.e) * unit_m * unit_m)
        return CellAreas(max(map_file.height, 1), max(map_file.width, 1), flat)
    if crs.is_geographic:
        return CellAreas(1, max(map_file.width, 1), _geographic_rows(crs, map_file)[:, None])
    pixel_m = abs(t.a) * unit_m
    side = max(1, min(MAX_CELL_PX, int(CELL_GROUND_M // max(pixel_m, 1e-9))))
    side = max(side, math.ceil(math.sqrt(map_file.width * map_file.height / MAX_CELLS)))
    rows = np.minimum(np.arange(0, map_file.height + side, side), map_file.height)
    cols = np.minimum(np.arange(0, map_file.width + side, side), map_file.width)
    rows, cols = np.unique(rows), np.unique(cols)  # the lattice of cell corners
    x = t.c + t.a * cols.astype(np.float64)
    y = t.f + t.e * rows.astype(np.float64)
    xx, yy = np.meshgrid(x, y)
    lon, _ = pyproj.Transformer.from_crs(crs, crs.geodetic_crs, always_xy=True).transform(
        float(x.mean()), float(y.mean())
    )
    centre_lon = float(lon) if math.isfinite(float(lon)) else 0.0
    equal_area = ProjectedCRS(
        conversion=LambertCylindricalEqualAreaConversion(
            latitude_first_parallel=0.0, longitude_natural_origin=centre_lon
        ),
        geodetic_crs=crs.geodetic_crs,
    )
    ex, ey = pyproj.Transformer.from_crs(crs, equal_area, always_xy=True).transform(xx, yy)
    # Each cell a quadrilateral: half the cross product of its diagonals.
    d1x, d1y = ex[1:, 1:] - ex[:-1, :-1], ey[1:, 1:] - ey[:-1, :-1]
    d2x, d2y = ex[1:, :-1] - ex[:-1, 1:], ey[1:, :-1] - ey[:-1, 1:]
    cell_m2 = 0.5 * np.abs(d1x * d2y - d1y * d2x)
    pixels = np.outer(np.diff(rows), np.diff(cols)).astype(np.float64)
    nominal = abs(t.a * t.e) * unit_m * unit_m
    per_pixel = np.where(np.isfinite(cell_m2), cell_m2 / np.maximum(pixels, 1.0), np.nan)
    if not np.isfinite(per_pixel).all():
        logger.warning(
            "%s: part of the map lies outside its CRS's valid area; its pixels there are "
            "counted at their nominal size",
            map_file.given,
        )
        per_pixel = np.where(np.isfinite(per_pixel), per_pixel, nominal)
    return CellAreas(side, side, per_pixel)


def _geographic_rows(crs: pyproj.CRS, map_file: MapFile) -> npt.NDArray[np.float64]:
    """The area of a pixel of each row of a map in a geographic CRS: the cell between two
    latitudes and two longitudes on the ellipsoid, a² Δλ (q(φ₁) − q(φ₂)) / 2."""
    ellipsoid = crs.ellipsoid
    a = ellipsoid.semi_major_metre if ellipsoid is not None else 6_378_137.0
    b = ellipsoid.semi_minor_metre if ellipsoid is not None else a
    e2 = 1.0 - (b / a) ** 2
    unit_rad = crs.axis_info[0].unit_conversion_factor if crs.axis_info else math.pi / 180
    t = map_file.transform
    edges = np.clip((t.f + t.e * np.arange(map_file.height + 1)) * unit_rad, -np.pi / 2, np.pi / 2)
    q = _authalic_q(np.sin(edges), e2)
    areas: npt.NDArray[np.float64] = a * a * abs(t.a) * unit_rad * np.abs(q[:-1] - q[1:]) / 2
    return areas


def _authalic_q(sin_phi: npt.NDArray[np.float64], e2: float) -> npt.NDArray[np.float64]:
    """q(φ) of the authalic latitude: 2 sin φ on a sphere."""
    if e2 < 1e-15:
        sphere: npt.NDArray[np.float64] = 2.0 * sin_phi
        return sphere
    e = math.sqrt(e2)
    es = e * sin_phi
    q: npt.NDArray[np.float64] = (1.0 - e2) * (
        sin_phi / (1.0 - e2 * sin_phi**2) - np.log((1.0 - es) / (1.0 + es)) / (2.0 * e)
    )
    return q


def _strips(map_file: MapFile) -> Iterator[Window]:
    """Windows of whole rows, a multiple of the block height, about `STRIP_PIXELS` each."""
    with rasterio.open(map_file.readable) as ds:
        block_rows = ds.block_shapes[0][0] if ds.block_shapes else 256
    rows = max(block_rows, (STRIP_PIXELS // max(map_file.width, 1)) // block_rows * block_rows)
    for row0 in range(0, map_file.height, rows):
        yield Window(0, row0, map_file.width, min(rows, map_file.height - row0))


def _count_strip(
    codes: npt.NDArray[np.uint8], cells: CellAreas, row0: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Pixels and square metres of each code 0..255 in a strip whose first row is `row0`."""
    counts = np.bincount(codes.ravel(), minlength=256).astype(np.int64)
    area = np.zeros(256, dtype=np.float64)
    height, width = codes.shape
    row = 0
    while row < height:
        i = (row0 + row) // cells.rows
        stop = min(height, (i + 1) * cells.rows - row0)
        band = codes[row:stop]
        per_cell = cells.pixel_m2[i]
        if per_cell.size == 1:
            area += np.bincount(band.ravel(), minlength=256) * float(per_cell[0])
        else:
            step = max(1, WEIGHT_PIXELS // (band.shape[0] * cells.cols)) * cells.cols
            for col0 in range(0, width, step):
                part = band[:, col0 : col0 + step]
                first = col0 // cells.cols
                weights = np.repeat(
                    per_cell[first : first + -(-part.shape[1] // cells.cols)], cells.cols
                )[: part.shape[1]]
                area += np.bincount(
                    part.ravel(),
                    weights=np.broadcast_to(weights, part.shape).ravel(),
                    minlength=256,
                )
        row = stop
    return counts, area
