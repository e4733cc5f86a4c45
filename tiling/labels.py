"""Label rasters against images: which overlap, whether they share a pixel grid, and raw
values to class codes. Pure functions of `RasterInfo` values; the reads are in `tiling.reader`.

An image's labels are the label rasters whose footprint overlaps it (not a file-name
match). A label raster on the very pixel grid of the image is read by window; any other is
warped (`RasterReader.read_labels`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.warp
from rasterio.crs import CRS

from tiling.classes import NODATA_CODE, ClassMap
from tiling.errors import LabelError
from tiling.grid import aligned_offset
from tiling.sources import Bounds, RasterInfo

__all__ = ["footprint_in", "grid_offset", "label_codes", "match_labels"]

# Marks raw values the class map does not know in `label_codes`'s uint8 table; never a class
# code there (tables of more classes take the general path).
_UNKNOWN_CODE = 255


def footprint_in(info: RasterInfo, crs: CRS) -> Bounds:
    """The raster's bounds transformed into `crs` (edges densified, so curved edges count)."""
    if info.crs == crs:
        return info.bounds
    left, bottom, right, top = rasterio.warp.transform_bounds(
        info.crs, crs, *info.bounds, densify_pts=21
    )
    return (left, bottom, right, top)


def _overlap(a: Bounds, b: Bounds) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def match_labels(image: RasterInfo, labels: Sequence[RasterInfo]) -> tuple[RasterInfo, ...]:
    """The label rasters whose footprint overlaps the image; `LabelError` if none does."""
    hits = tuple(lab for lab in labels if _overlap(footprint_in(image, lab.crs), lab.bounds))
    if not hits:
        b = image.bounds
        raise LabelError(
            f"{image.path}: no label raster overlaps it (image bounds {b[0]:.0f}, {b[1]:.0f}, "
            f"{b[2]:.0f}, {b[3]:.0f} in {image.crs_name}); pass --labels that cover it, "
            "or omit --labels for an images-only store"
        )
    return hits


def grid_offset(image: RasterInfo, lab: RasterInfo) -> tuple[int, int] | None:
    """(rows, cols) from an image pixel to the same pixel of `lab` if both share one grid.

    Same CRS, same pixel size, no rotation and origins a whole number of pixels apart, within
    `tiling.grid.GRID_TOLERANCE_PX`: then labels are read, not warped (the same labels, as
    nearest-neighbour warping picks them, and much cheaper than GDAL's warper).
    """
    if lab.crs != image.crs:
        return None
    span_px = max(image.width, image.height)
    return aligned_offset(image.transform, lab.transform, span_px=span_px)


def label_codes(
    raw: npt.NDArray[np.integer[Any]], lab: RasterInfo, class_map: ClassMap
) -> npt.NDArray[np.uint8]:
    """Raw label values → class codes; the raster's nodata becomes 0; unknown values raise."""
    nodata = lab.nodata
    if nodata is not None and not (float(nodata).is_integer() and 0 <= nodata <= 255):
        # A nodata value outside 0..255 (e.g. -1 in int16) cannot go through the table.
        valid = raw != nodata
        codes = np.zeros(raw.shape, dtype=np.uint8)
        codes[valid] = class_map.apply(raw[valid], where=lab.path)
        return codes
    code_nodata = None if nodata is None else int(nodata)
    if raw.dtype == np.uint8 and class_map.num_classes <= _UNKNOWN_CODE:
        # The usual uint8 labels: one pass through a 256-byte table (nodata -> 0 folded in;
        # bytes.translate, 3x cheaper than numpy's fancy indexing, which widens every value
        # to int64 first), and one max() to see an unknown value; class_map.apply names it.
        table = class_map.lut.copy()
        if code_nodata is not None:
            table[code_nodata] = NODATA_CODE
        unknown = table < 0
        table_bytes = np.where(unknown, _UNKNOWN_CODE, table).astype(np.uint8).tobytes()
        mapped = bytearray(np.ascontiguousarray(raw)).translate(table_bytes)
        looked_up = np.frombuffer(mapped, dtype=np.uint8).reshape(raw.shape)
        if not unknown.any() or looked_up.max() != _UNKNOWN_CODE:
            return looked_up
    return class_map.apply(raw, nodata=code_nodata, where=lab.path)
