"""Label rasters against images: which overlap, whether they share a pixel grid, and raw
values to class codes. Pure functions of `RasterInfo` values; the reads are in
`tiling.sources.reader`.

An image's labels are the label rasters whose footprint overlaps it (not a file-name
match). A label raster on the very pixel grid of the image is read by window; any other is
warped (`RasterReader.read_labels`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from rasterio.crs import CRS
from shapely import STRtree, box

from tiling.errors import LabelError
from tiling.sources.classes import NODATA_CODE, ClassMap
from tiling.sources.crs import crs_key, transformer
from tiling.sources.grid import aligned_offset
from tiling.sources.rasters import Bounds, RasterInfo

__all__ = ["LabelIndex", "footprint_in", "grid_offset", "label_codes", "match_labels"]

# Marks raw values the class map does not know in `label_codes`'s uint8 table; never a class
# code there (tables of more classes take the general path).
_UNKNOWN_CODE = 255


def footprint_in(info: RasterInfo, crs: CRS) -> Bounds:
    """The raster's bounds transformed into `crs` (edges densified, so curved edges count)."""
    if crs_key(info.crs) == crs_key(crs):
        return info.bounds
    left, bottom, right, top = transformer(info.crs, crs).transform_bounds(
        *info.bounds, densify_pts=21
    )
    return (left, bottom, right, top)


def _overlap(a: Bounds, b: Bounds) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


class LabelIndex:
    """Label rasters grouped by CRS, each group's footprints in an STRtree.

    Matching an image costs one footprint transform per label CRS and one tree query, not a
    transform per label raster: planning thousands of images against thousands of label
    tiles stays O(N log N). The matches are those of the pairwise rule (`_overlap` of the
    image's footprint in the label's CRS with the label's bounds), in the labels' order.
    """

    def __init__(self, labels: Sequence[RasterInfo]) -> None:
        self._labels = tuple(labels)
        self._bounds = [lab.bounds for lab in self._labels]
        members: dict[str, list[int]] = {}
        crs_of: dict[str, CRS] = {}
        for i, lab in enumerate(self._labels):
            key = crs_key(lab.crs)
            members.setdefault(key, []).append(i)
            crs_of.setdefault(key, lab.crs)
        self._groups = [
            (crs_of[key], np.asarray(ids), STRtree([box(*self._bounds[i]) for i in ids]))
            for key, ids in members.items()
        ]

    def __len__(self) -> int:
        return len(self._labels)

    def match(self, image: RasterInfo) -> tuple[RasterInfo, ...]:
        """The label rasters whose footprint overlaps the image; `LabelError` if none does."""
        hits: list[int] = []
        for crs, ids, tree in self._groups:
            footprint = footprint_in(image, crs)
            for k in tree.query(box(*footprint)):
                i = int(ids[k])
                if _overlap(footprint, self._bounds[i]):
                    hits.append(i)
        if not hits:
            b = image.bounds
            raise LabelError(
                f"{image.path}: no label raster overlaps it (image bounds {b[0]:.0f}, "
                f"{b[1]:.0f}, {b[2]:.0f}, {b[3]:.0f} in {image.crs_name}); pass --labels that "
                "cover it, or omit --labels for an images-only store"
            )
        return tuple(self._labels[i] for i in sorted(hits))


def match_labels(image: RasterInfo, labels: Sequence[RasterInfo]) -> tuple[RasterInfo, ...]:
    """The label rasters whose footprint overlaps the image; `LabelError` if none does.
    (One image: to match many, build a `LabelIndex` once.)"""
    return LabelIndex(labels).match(image)


def grid_offset(image: RasterInfo, lab: RasterInfo) -> tuple[int, int] | None:
    """(rows, cols) from an image pixel to the same pixel of `lab` if both share one grid.

    Same CRS, same pixel size, no rotation and origins a whole number of pixels apart, within
    `tiling.sources.grid.GRID_TOLERANCE_PX`: then labels are read, not warped (the same labels, as
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
