"""Reading windows of input rasters: image pixels with their valid-pixel mask, and label
codes aligned onto an image's pixel grid.

Invalid pixels are returned as 0 in every band whatever the image's rule (nodata value,
internal mask or zero fill, see `tiling.sources.rasters`), so every consumer (the chip store,
prediction) sees one convention: all-zero = no data.

An image's labels are the label rasters whose footprint overlaps it (`tiling.sources.labels`); their
class codes are warped onto the image grid with nearest-neighbour resampling, window by
window, the first label raster in input order winning where several cover a pixel. A label
raster on the image's very pixel grid is read with a plain window read instead.

GDAL handles are not thread-safe: a `RasterReader` keeps a few open handles per thread.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.errors
import rasterio.warp
import rasterio.windows
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling

from tiling.runtime.urls import is_local
from tiling.sources.classes import NODATA_CODE, ClassMap
from tiling.sources.grid import covering_window
from tiling.sources.labels import grid_offset, label_codes
from tiling.sources.rasters import Bounds, RasterInfo, open_raster

__all__ = ["RasterReader"]


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
            elif nodata == 0:
                return pixels, _any_band_nonzero(pixels)  # invalid ones are 0 already
            else:
                valid = _any_band_differs(pixels, np.uint8(nodata))
        elif internal is not None:
            valid = internal != 0
        elif image.mask_kind == "zero":
            return pixels, _any_band_nonzero(pixels)  # invalid ones are 0 already
        else:
            valid = np.ones(pixels.shape[1:], dtype=bool)
        if not valid.all():
            # one pass per band; a boolean-index assignment costs several
            np.multiply(pixels, valid, out=pixels)
        return pixels, valid

    def read_labels(
        self,
        image: RasterInfo,
        window: rasterio.windows.Window,
        labels: Sequence[RasterInfo],
        class_map: ClassMap,
    ) -> npt.NDArray[np.uint8]:
        """Class codes (h, w) on the image's grid for `window`; 0 where no label covers it."""
        out: npt.NDArray[np.uint8] | None = None
        for k, lab in enumerate(labels):
            offset = grid_offset(image, lab)
            if offset is not None:
                codes = self._aligned_codes(lab, window, offset, class_map)
            else:
                warped = self._warped_codes(lab, image, window, class_map)
                if warped is None:
                    continue
                codes = warped
            if out is None:
                out = codes  # the first raster covering the window: nothing to merge into
            else:
                np.copyto(out, codes, where=out == NODATA_CODE)
            if k + 1 == len(labels) or not (out == NODATA_CODE).any():
                break
        if out is None:
            return np.zeros((int(window.height), int(window.width)), dtype=np.uint8)
        return out

    def _warped_codes(
        self,
        lab: RasterInfo,
        image: RasterInfo,
        window: rasterio.windows.Window,
        class_map: ClassMap,
    ) -> npt.NDArray[np.uint8] | None:
        """Codes of a label raster on another grid, warped (nearest) onto the image's window;
        None if it does not reach the window."""
        dst_bounds = rasterio.windows.bounds(window, image.transform)
        codes = self._label_codes(lab, dst_bounds, image.crs, class_map)
        if codes is None:
            return None
        codes_arr, src_transform = codes
        warped = np.zeros((int(window.height), int(window.width)), dtype=np.uint8)
        rasterio.warp.reproject(
            source=codes_arr,
            destination=warped,
            src_transform=src_transform,
            src_crs=lab.crs,
            src_nodata=NODATA_CODE,
            dst_transform=rasterio.windows.transform(window, image.transform),
            dst_crs=image.crs,
            dst_nodata=NODATA_CODE,
            resampling=Resampling.nearest,
            # Exact transforms, no approximation: a pixel's label must not depend on
            # which read window it falls in.
            tolerance=0,
        )
        return warped

    def _aligned_codes(
        self,
        lab: RasterInfo,
        window: rasterio.windows.Window,
        offset: tuple[int, int],
        class_map: ClassMap,
    ) -> npt.NDArray[np.uint8]:
        """Codes of a label raster on the very pixel grid of the image: a plain window read."""
        height, width = int(window.height), int(window.width)
        row0 = int(window.row_off) + offset[0]
        col0 = int(window.col_off) + offset[1]
        r0, c0 = max(row0, 0), max(col0, 0)
        r1, c1 = min(row0 + height, lab.height), min(col0 + width, lab.width)
        if r1 <= r0 or c1 <= c0:
            return np.zeros((height, width), dtype=np.uint8)
        with self._dataset(lab.path) as ds:
            raw = ds.read(1, window=rasterio.windows.Window(c0, r0, c1 - c0, r1 - r0))
        codes = label_codes(raw, lab, class_map)
        if codes.shape == (height, width):
            return codes  # the window lies inside the label raster
        out = np.zeros((height, width), dtype=np.uint8)
        out[r0 - row0 : r1 - row0, c0 - col0 : c1 - col0] = codes
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
        read_win = covering_window(bounds, lab.transform, lab.height, lab.width)
        if read_win is None:
            return None
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


def _any_band_nonzero(pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Pixels where some band is not 0: `_any_band_differs(pixels, 0)` in one OR reduction."""
    combined: npt.NDArray[np.uint8] = np.bitwise_or.reduce(pixels, axis=0)
    return np.not_equal(combined, 0)
