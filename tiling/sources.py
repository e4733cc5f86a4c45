"""Input rasters: expand paths/globs/URLs, open and validate NAIP images and label rasters,
and align labels onto an image's pixel grid.

Images must be 4-band uint8 (R, G, B, NIR) GeoTIFFs with a CRS. Which pixels are valid comes
from the image's nodata value (a pixel whose four bands all equal it) or from an internal
mask, never from an alpha band: several NAIP files tag their NIR band as alpha, and NIR is
data. A file that declares neither gets the zero-fill rule: a pixel that is 0 in all four
bands is nodata. Most NAIP files carry no nodata tag yet have black collars, and counting
those as imagery gives chips of pure black labelled as land cover and warps that blend black
into real pixels; a real pixel at 0 in all of R, G, B and NIR essentially never occurs.
`open_image(..., zero_is_nodata=False)` (CLI `--no-zero-nodata`) opts out.

Invalid pixels are returned as 0 in every band whatever the rule, so every consumer (the
chip store, prediction) sees one convention: all-zero = no data.

Labels are single-band integer rasters in any CRS and resolution. An image's labels are the
label rasters whose footprint overlaps it (not a file-name match); their class codes are
warped onto the image grid with nearest-neighbour resampling, window by window, the first
label raster in input order winning where several cover a pixel.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.errors
import rasterio.warp
import rasterio.windows
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import MaskFlags, Resampling

from tiling.classes import NODATA_CODE, ClassMap
from tiling.errors import LabelError, SourceFormatError, SourceNotFoundError
from tiling.inputs import RASTER_SUFFIXES, expand_inputs
from tiling.labels import Bounds, grid_offset, label_codes, match_labels
from tiling.urls import filesystem, is_local, local_path

__all__ = [
    "RASTER_SUFFIXES",
    "RasterInfo",
    "RasterReader",
    "expand_inputs",
    "match_labels",
    "open_image",
    "open_label",
    "open_raster",
]

logger = logging.getLogger(__name__)

NAIP_BANDS = 4


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


# ---------------------------------------------------------------------------------------
# Opening rasters


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
        if ds.count != NAIP_BANDS:
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


# ---------------------------------------------------------------------------------------
# Reading pixels (one reader per worker thread: GDAL handles are not thread-safe)


def _hide_spurious_warp_warning() -> None:
    """Filter rasterio's "Dataset has no geotransform" warning where rasterio.warp raises it.

    Its reproject of in-memory arrays now and then reports it when several threads warp
    at once, although every call here passes both transforms (seen with 2 worker threads,
    not with 1; the output is right either way). It would reach the user as a raw warning.
    Only that module and message; a filter, not catch_warnings, which is not thread-safe;
    installed when a reader is made (not at import) so that a test runner's saved filters
    do not drop it.
    """
    warnings.filterwarnings(
        "ignore",
        message="Dataset has no geotransform",
        category=rasterio.errors.NotGeoreferencedWarning,
        module="rasterio.warp",
    )


class RasterReader:
    """Reads image windows and aligned label windows, keeping a few handles open per thread."""

    def __init__(
        self, *, storage_options: Mapping[str, Any] | None = None, max_open: int = 8
    ) -> None:
        _hide_spurious_warp_warning()
        self._storage_options = dict(storage_options or {})
        self._max_open = max_open
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[Any] = []  # every handle of every thread, so close() reaches them

    @contextmanager
    def _dataset(self, path: str) -> Iterator[rasterio.DatasetReader]:
        """A handle for this thread: cached for local files, per call for URLs.

        rasterio's Python-file opener (used for URLs) keeps its files per thread, so a remote
        dataset must be closed by the thread that opened it.
        """
        if not is_local(path):
            with open_raster(path, self._storage_options) as ds:
                yield ds
            return
        cache: OrderedDict[str, Any] | None = getattr(self._local, "cache", None)
        if cache is None:
            cache = OrderedDict()
            self._local.cache = cache
        if path in cache:
            cache.move_to_end(path)
            yield cache[path][1]
            return
        manager = open_raster(path, self._storage_options)
        ds = manager.__enter__()
        cache[path] = (manager, ds)
        with self._lock:
            self._open.append(manager)
        while len(cache) > self._max_open:
            _, (old_manager, _) = cache.popitem(last=False)
            with self._lock:
                self._open.remove(old_manager)
            old_manager.__exit__(None, None, None)
        yield ds

    def close(self) -> None:
        """Close every cached handle; call once the worker threads are done."""
        with self._lock:
            managers, self._open = self._open, []
        for manager in managers:
            manager.__exit__(None, None, None)

    def read_image(
        self, image: RasterInfo, window: rasterio.windows.Window
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
        """Pixels (4, h, w) and the valid-pixel mask (h, w) of a window.

        Invalid pixels come back as 0 in every band (whatever the file holds there).
        """
        with self._dataset(image.path) as ds:
            pixels = ds.read(window=window, out_dtype="uint8")
            internal = ds.read_masks(1, window=window) if image.mask_kind == "internal" else None
        if image.mask_kind == "nodata" and image.nodata is not None:
            nodata = image.nodata
            if not (0 <= nodata <= 255 and float(nodata).is_integer()):
                valid = np.ones(pixels.shape[1:], dtype=bool)
            else:
                valid = _any_band_differs(pixels, np.uint8(nodata))
        elif internal is not None:
            valid = internal != 0
        elif image.mask_kind == "zero":
            return pixels, _any_band_differs(pixels, np.uint8(0))  # invalid ones are 0 already
        else:
            valid = np.ones(pixels.shape[1:], dtype=bool)
        if not valid.all():
            pixels[:, ~valid] = 0
        return pixels, valid

    def read_labels(
        self,
        image: RasterInfo,
        window: rasterio.windows.Window,
        labels: Sequence[RasterInfo],
        class_map: ClassMap,
    ) -> npt.NDArray[np.uint8]:
        """Class codes (h, w) on the image's grid for `window`; 0 where no label covers it."""
        height, width = int(window.height), int(window.width)
        dst_transform = rasterio.windows.transform(window, image.transform)
        out = np.zeros((height, width), dtype=np.uint8)
        dst_bounds = rasterio.windows.bounds(window, image.transform)
        for lab in labels:
            offset = grid_offset(image, lab)
            if offset is not None:
                warped = self._aligned_codes(lab, window, offset, class_map)
                np.copyto(out, warped, where=out == NODATA_CODE)
                if not (out == NODATA_CODE).any():
                    break
                continue
            codes = self._label_codes(lab, dst_bounds, image.crs, class_map)
            if codes is None:
                continue
            codes_arr, src_transform = codes
            warped = np.zeros((height, width), dtype=np.uint8)
            rasterio.warp.reproject(
                source=codes_arr,
                destination=warped,
                src_transform=src_transform,
                src_crs=lab.crs,
                src_nodata=NODATA_CODE,
                dst_transform=dst_transform,
                dst_crs=image.crs,
                dst_nodata=NODATA_CODE,
                resampling=Resampling.nearest,
                # Exact transforms, no approximation: a pixel's label must not depend on
                # which read window it falls in.
                tolerance=0,
            )
            np.copyto(out, warped, where=out == NODATA_CODE)
            if not (out == NODATA_CODE).any():
                break
        return out

    def _aligned_codes(
        self,
        lab: RasterInfo,
        window: rasterio.windows.Window,
        offset: tuple[int, int],
        class_map: ClassMap,
    ) -> npt.NDArray[np.uint8]:
        """Codes of a label raster on the very pixel grid of the image: a plain window read."""
        height, width = int(window.height), int(window.width)
        out = np.zeros((height, width), dtype=np.uint8)
        row0 = int(window.row_off) + offset[0]
        col0 = int(window.col_off) + offset[1]
        r0, c0 = max(row0, 0), max(col0, 0)
        r1, c1 = min(row0 + height, lab.height), min(col0 + width, lab.width)
        if r1 <= r0 or c1 <= c0:
            return out
        with self._dataset(lab.path) as ds:
            raw = ds.read(1, window=rasterio.windows.Window(c0, r0, c1 - c0, r1 - r0))
        out[r0 - row0 : r1 - row0, c0 - col0 : c1 - col0] = label_codes(raw, lab, class_map)
        return out

    def _label_codes(
        self, lab: RasterInfo, dst_bounds: Bounds, dst_crs: CRS, class_map: ClassMap
    ) -> tuple[npt.NDArray[np.uint8], Affine] | None:
        """Class codes of the part of `lab` under `dst_bounds` (plus a pixel margin)."""
        if lab.crs == dst_crs:
            bounds = dst_bounds
        else:
            left, bottom, right, top = rasterio.warp.transform_bounds(
                dst_crs, lab.crs, *dst_bounds, densify_pts=21
            )
            bounds = (left, bottom, right, top)
        win = rasterio.windows.from_bounds(*bounds, transform=lab.transform)
        row0 = max(0, math.floor(win.row_off) - 1)
        col0 = max(0, math.floor(win.col_off) - 1)
        row1 = min(lab.height, math.ceil(win.row_off + win.height) + 1)
        col1 = min(lab.width, math.ceil(win.col_off + win.width) + 1)
        if row1 <= row0 or col1 <= col0:
            return None
        read_win = rasterio.windows.Window(col0, row0, col1 - col0, row1 - row0)
        with self._dataset(lab.path) as ds:
            raw = ds.read(1, window=read_win)
        transform = rasterio.windows.transform(read_win, lab.transform)
        nodata = lab.nodata
        if nodata is None or (float(nodata).is_integer() and 0 <= nodata <= 255):
            code_nodata = None if nodata is None else int(nodata)
            return class_map.apply(raw, nodata=code_nodata, where=lab.path), transform
        # A nodata value outside 0..255 (e.g. -1 in int16) cannot go through the lookup table.
        valid = raw != nodata
        codes = np.zeros(raw.shape, dtype=np.uint8)
        codes[valid] = class_map.apply(raw[valid], where=lab.path)
        return codes, transform


def _any_band_differs(pixels: npt.NDArray[np.uint8], value: np.uint8) -> npt.NDArray[np.bool_]:
    """Pixels where some band is not `value` (an OR over bands: 5x cheaper than np.any)."""
    combined: npt.NDArray[np.uint8] = pixels[0] ^ value
    for band in pixels[1:]:
        combined |= band ^ value
    return np.not_equal(combined, 0)
