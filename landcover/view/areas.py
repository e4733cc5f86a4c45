"""The area of each class of a land-cover map, exact: every pixel is counted, in strips of
whole block rows (memory bounded by a strip, whatever the map's size), read by a few threads
(GDAL decompresses blocks without the GIL).

A pixel's area is that of the map's CRS: its size times the CRS's linear unit in metres, or
in a geographic CRS the area on the sphere of equal area (radius 6,371,007 m) of each row's
pixels at its latitude.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import rasterio
from rasterio.windows import Window

from landcover.classes import NODATA_CODE
from landcover.view.mapfile import MapFile

__all__ = ["ClassArea", "class_areas", "pixel_area_m2"]

STRIP_PIXELS = 8 * 1024 * 1024  # pixels per read: 8 MiB of uint8 per thread
READ_THREADS = 4
AUTHALIC_RADIUS_M = 6_371_007.2


@dataclass(frozen=True, slots=True)
class ClassArea:
    """One class of a map: code, name, colour, pixels counted, area and its share of the
    mapped area (every class but nodata)."""

    code: int
    name: str
    color: tuple[int, int, int]
    pixels: int
    area_km2: float
    share: float  # 0..1


def class_areas(map_file: MapFile) -> list[ClassArea]:
    """The classes of `map_file`'s table (nodata aside) with their exact pixel counts and
    areas (see the module docstring)."""
    rows_area = _row_areas_m2(map_file)
    counts = np.zeros(256, dtype=np.int64)
    area_m2 = np.zeros(256, dtype=np.float64)
    lock = threading.Lock()
    local = threading.local()
    datasets: list[rasterio.io.DatasetReader] = []

    def count(window: Window) -> None:
        ds = getattr(local, "ds", None)
        if ds is None:  # a GDAL dataset is not shared between threads
            ds = local.ds = rasterio.open(map_file.path)
            with lock:
                datasets.append(ds)
        codes = ds.read(1, window=window)
        strip_counts, strip_area = _count_strip(codes, rows_area, int(window.row_off))
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
    mapped_m2 = float(sum(area_m2[c.code] for c in map_file.class_map.classes if c.code))
    return [
        ClassArea(
            code=c.code,
            name=c.name,
            color=c.color,
            pixels=int(counts[c.code]),
            area_km2=float(area_m2[c.code]) / 1e6,
            share=float(area_m2[c.code]) / mapped_m2 if mapped_m2 > 0 else 0.0,
        )
        for c in map_file.class_map.classes
        if c.code != NODATA_CODE
    ]


def pixel_area_m2(map_file: MapFile) -> float:
    """The area of one pixel in square metres in a projected CRS (NaN in a geographic one,
    where it depends on the row)."""
    if map_file.crs.is_geographic:
        return math.nan
    try:
        unit_m = float(map_file.crs.linear_units_factor[1])
    except rasterio.errors.CRSError:
        unit_m = 1.0  # a CRS that names no unit: metres, as most do
    t = map_file.transform
    return abs(t.a * t.e) * unit_m * unit_m


def _row_areas_m2(map_file: MapFile) -> npt.NDArray[np.float64]:
    """The area of a pixel of each row."""
    if not map_file.crs.is_geographic:
        return np.full(map_file.height, pixel_area_m2(map_file))
    t = map_file.transform
    edges = t.f + t.e * np.arange(map_file.height + 1)  # latitudes of the row edges
    band = np.abs(np.sin(np.radians(edges[:-1])) - np.sin(np.radians(edges[1:])))
    areas: npt.NDArray[np.float64] = AUTHALIC_RADIUS_M**2 * math.radians(abs(t.a)) * band
    return areas


def _strips(map_file: MapFile) -> Iterator[Window]:
    """Windows of whole rows, a multiple of the block height, about `STRIP_PIXELS` each."""
    with rasterio.open(map_file.path) as ds:
        block_rows = ds.block_shapes[0][0] if ds.block_shapes else 256
    rows = max(block_rows, (STRIP_PIXELS // max(map_file.width, 1)) // block_rows * block_rows)
    for row0 in range(0, map_file.height, rows):
        yield Window(0, row0, map_file.width, min(rows, map_file.height - row0))


def _count_strip(
    codes: npt.NDArray[np.uint8], rows_area: npt.NDArray[np.float64], row0: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Pixels and square metres of each code 0..255 in a strip whose first row is `row0`."""
    counts = np.bincount(codes.ravel(), minlength=256).astype(np.int64)
    strip_areas = rows_area[row0 : row0 + codes.shape[0]]
    if np.all(strip_areas == strip_areas[0]):
        uniform = counts.astype(np.float64) * float(strip_areas[0])
        return counts, uniform
    per_row = np.stack([np.bincount(row, minlength=256) for row in codes])
    area: npt.NDArray[np.float64] = strip_areas @ per_row
    return counts, area
