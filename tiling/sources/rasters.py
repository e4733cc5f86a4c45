"""Input rasters: open and validate NAIP images and label rasters, and describe them
(`RasterInfo`: grid, bands, which pixels are valid) without reading their pixels.

Expanding paths/globs/URLs is `tiling.sources.inputs`, matching labels to images
`tiling.sources.labels`; reading windows of pixels and warping labels onto an image's grid is
`tiling.sources.reader`.

Images must be 4-band uint8 (R, G, B, NIR) GeoTIFFs with a CRS. Which pixels are valid comes
from the image's nodata value (a pixel whose four bands all equal it) or from an internal
mask, never from an alpha band: several NAIP files tag their NIR band as alpha, and NIR is
data. A file that declares neither gets the zero-fill rule: a pixel that is 0 in all four
bands is nodata. Most NAIP files carry no nodata tag yet have black collars, and counting
those as imagery gives chips of pure black labelled as land cover and warps that blend black
into real pixels; a real pixel at 0 in all of R, G, B and NIR essentially never occurs.
`open_image(..., zero_is_nodata=False)` (CLI `--no-zero-nodata`) opts out.

Labels are single-band integer rasters of class codes in any CRS and resolution.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import rasterio
import rasterio.errors
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import MaskFlags

from tiling.errors import LabelError, SourceFormatError, SourceNotFoundError
from tiling.runtime.urls import check_remote_file, filesystem, is_local, local_path
from tiling.sources.bands import NUM_BANDS
from tiling.sources.inputs import RASTER_SUFFIXES, expand_inputs

__all__ = [
    "RASTER_SUFFIXES",
    "Bounds",
    "RasterInfo",
    "expand_inputs",
    "open_image",
    "open_label",
    "open_raster",
]

logger = logging.getLogger(__name__)

# (left, bottom, right, top) in the raster's CRS.
Bounds = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class RasterInfo:
    """What we know about a raster without reading its pixels."""

    path: str
    crs: CRS
    transform: Affine
    height: int
    width: int
    count: int
    dtype: str
    nodata: float | None
    block_shape: tuple[int, int]
    mask_kind: str  # "nodata" | "internal" | "zero" (all four bands 0) | "none"

    @property
    def bounds(self) -> Bounds:
        left, top = self.transform @ (0, 0)
        right, bottom = self.transform @ (self.width, self.height)
        return (min(left, right), min(bottom, top), max(left, right), max(bottom, top))

    @property
    def resolution_m(self) -> float:
        """Pixel width in metres (approximate for a geographic CRS)."""
        size = math.hypot(self.transform.a, self.transform.d)
        if self.crs.is_geographic:
            lat = (self.bounds[1] + self.bounds[3]) / 2
            return size * 111_320.0 * math.cos(math.radians(lat))
        try:
            return size * float(self.crs.linear_units_factor[1])
        except rasterio.errors.CRSError:
            return size

    @property
    def crs_name(self) -> str:
        epsg = self.crs.to_epsg()
        return f"EPSG:{epsg}" if epsg else "its CRS"


@contextmanager
def open_raster(
    path: str, storage_options: Mapping[str, Any] | None = None
) -> Iterator[rasterio.DatasetReader]:
    """Open a local or remote raster for reading; corrupt files raise `SourceFormatError`."""
    try:
        if is_local(path):
            ds = rasterio.open(str(local_path(path)))
        else:
            fs, _ = filesystem(path, storage_options)
            ds = rasterio.open(path, opener=fs)
    except rasterio.errors.RasterioIOError as exc:
        if is_local(path) and not os.path.exists(local_path(path)):
            raise SourceNotFoundError(f"{path}: no such file; check the path") from None
        check_remote_file(path, storage_options)  # a 404 or a dead host is not a bad file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
        raise SourceFormatError(
            f"{path}: not a readable GeoTIFF ({reason}); re-download it or leave it out"
        ) from None
    try:
        yield ds
    finally:
        ds.close()


def raster_info(
    ds: rasterio.DatasetReader, path: str, *, zero_is_nodata: bool = False
) -> RasterInfo:
    block_h, block_w = ds.block_shapes[0] if ds.block_shapes else (ds.height, ds.width)
    mask_kind = _mask_kind(ds)
    if mask_kind == "none" and zero_is_nodata:
        mask_kind = "zero"
    return RasterInfo(
        path=path,
        crs=ds.crs,
        transform=ds.transform,
        height=ds.height,
        width=ds.width,
        count=ds.count,
        dtype=ds.dtypes[0],
        nodata=ds.nodata,
        block_shape=(int(block_h), int(block_w)),
        mask_kind=mask_kind,
    )


def _mask_kind(ds: rasterio.DatasetReader) -> str:
    """How to tell valid pixels. An alpha band is never used: NAIP NIR is often tagged alpha."""
    if ds.nodata is not None:
        return "nodata"
    flags = ds.mask_flag_enums
    if flags and all(
        MaskFlags.per_dataset in f and MaskFlags.alpha not in f and MaskFlags.nodata not in f
        for f in flags
    ):
        return "internal"
    return "none"


def _check_georeferenced(ds: rasterio.DatasetReader, path: str) -> None:
    if ds.crs is None:
        raise SourceFormatError(
            f"{path}: has no CRS; assign one (e.g. gdal_edit.py -a_srs EPSG:26918 {path})"
        )
    if ds.transform == Affine.identity():
        raise SourceFormatError(
            f"{path}: has no geotransform; georeference it (e.g. gdal_edit.py -a_ullr)"
        )


@contextmanager
def _quiet_georeferencing() -> Iterator[None]:
    """Hide rasterio's NotGeoreferencedWarning where `_check_georeferenced` says it in one line.

    Only around the single-threaded validation opens: `catch_warnings` is process state.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        yield


def open_image(
    path: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    zero_is_nodata: bool = True,
) -> RasterInfo:
    """Validate a NAIP image: 4 bands, uint8, a CRS and a geotransform.

    `zero_is_nodata`: when the file declares no nodata value and has no internal mask,
    pixels that are 0 in all four bands are nodata (mask kind "zero"); False keeps them.
    """
    with _quiet_georeferencing(), open_raster(path, storage_options) as ds:
        if ds.count != NUM_BANDS:
            raise SourceFormatError(
                f"{path}: expected 4 bands (R, G, B, NIR), found {ds.count}; "
                "pass 4-band NAIP imagery"
            )
        if any(dt != "uint8" for dt in ds.dtypes):
            raise SourceFormatError(
                f"{path}: expected uint8 pixels, found {ds.dtypes[0]}; "
                "convert to 8-bit (e.g. gdal_translate -ot Byte -scale)"
            )
        _check_georeferenced(ds, path)
        return raster_info(ds, path, zero_is_nodata=zero_is_nodata)


def open_label(path: str, *, storage_options: Mapping[str, Any] | None = None) -> RasterInfo:
    """Validate a label raster: one band of integer class codes, a CRS and a geotransform."""
    with _quiet_georeferencing(), open_raster(path, storage_options) as ds:
        if ds.count != 1:
            raise LabelError(f"{path}: expected 1 band of class codes, found {ds.count}")
        if not np.issubdtype(np.dtype(ds.dtypes[0]), np.integer):
            raise LabelError(
                f"{path}: expected integer class codes, found {ds.dtypes[0]}; "
                "pass a land-cover raster (e.g. NLCD or Chesapeake)"
            )
        _check_georeferenced(ds, path)
        return raster_info(ds, path)
