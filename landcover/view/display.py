"""Small pictures of large rasters: a display grid, class maps and imagery read onto it from
the rasters' overviews, colours, and PNG/WebP encoding.

Every read asks GDAL for the raster decimated to about the display grid's pixel size
(`out_shape`), so GDAL reads the overview level that fits (a COG's internal overviews, a VRT
mosaic's from its tiles' overviews) and never the full-resolution array of a large map; the
decimated pixels are then warped onto the display grid in memory. Rasters without overviews
are read whole at full resolution by GDAL to decimate them (`gdaladdo` adds overviews).
"""

from __future__ import annotations

import base64
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.warp
import rasterio.windows
from affine import Affine
from PIL import Image
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling

from landcover.classes import NODATA_CODE, ClassMap
from tiling.sources.grid import covering_window, north_up_bounds

__all__ = [
    "DisplayGrid",
    "Located",
    "class_colours",
    "class_rgba",
    "classes_png",
    "data_uri",
    "locate",
    "read_classes",
    "read_imagery",
    "webp_bytes",
]

logger = logging.getLogger(__name__)

RGBA = npt.NDArray[np.uint8]  # (h, w, 4)


@dataclass(frozen=True, slots=True)
class DisplayGrid:
    """A north-up pixel grid to draw on: `transform` maps (col, row) to `crs` coordinates."""

    crs: CRS
    transform: Affine
    width: int
    height: int

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) in `crs`."""
        return north_up_bounds(self.transform, self.width, self.height)

    @classmethod
    def fitting(
        cls, crs: CRS, bounds: tuple[float, float, float, float], *, long_side_px: int
    ) -> DisplayGrid:
        """The grid of square pixels over `bounds` whose longer side has `long_side_px`
        pixels (the shorter side is rounded up, so the grid covers all of `bounds`)."""
        left, bottom, right, top = bounds
        size = max(right - left, top - bottom) / max(1, long_side_px)
        width = max(1, math.ceil((right - left) / size - 1e-9))
        height = max(1, math.ceil((top - bottom) / size - 1e-9))
        return cls(crs, Affine(size, 0.0, left, 0.0, -size, top), width, height)

    def part(self, row0: int, col0: int, height: int, width: int) -> DisplayGrid:
        """The rectangle of this grid at (row0, col0) of `height` x `width` pixels."""
        return DisplayGrid(self.crs, self.transform @ Affine.translation(col0, row0), width, height)


@dataclass(frozen=True, slots=True)
class Located:
    """A raster file and its bounds (left, bottom, right, top) in the display CRS."""

    path: str
    bounds: tuple[float, float, float, float]

    def touches(self, grid: DisplayGrid) -> bool:
        """Whether the raster reaches into `grid`."""
        left, bottom, right, top = grid.bounds
        return not (
            self.bounds[2] <= left
            or self.bounds[0] >= right
            or self.bounds[3] <= bottom
            or self.bounds[1] >= top
        )


def locate(paths: Sequence[str], crs: CRS, *, what: str = "image") -> tuple[Located, ...]:
    """Each file of `paths` with its bounds in `crs` (one header read each, so that a picture
    reads only the files under it); files that cannot be opened are left out with a
    warning."""
    found = []
    for path in paths:
        try:
            with rasterio.open(path) as src:
                bounds = tuple(src.bounds)
                if src.crs is not None and src.crs != crs:
                    bounds = rasterio.warp.transform_bounds(src.crs, crs, *bounds, densify_pts=21)
        except rasterio.errors.RasterioIOError as exc:
            logger.warning("cannot read the %s %s: %s", what, path, str(exc).splitlines()[0])
            continue
        found.append(Located(path, (bounds[0], bounds[1], bounds[2], bounds[3])))
    return tuple(found)


def read_classes(parts: Sequence[Located], grid: DisplayGrid) -> npt.NDArray[np.uint8]:
    """The class codes of a map (its files: one COG, or the tiles of a mosaic) on `grid`:
    nearest neighbour from the overview level that fits; 0 outside the map."""
    out = np.zeros((grid.height, grid.width), dtype=np.uint8)
    for part in parts:
        if not part.touches(grid):
            continue
        codes = np.zeros_like(out)
        with rasterio.open(part.path) as src:
            read = _decimated(src, grid, [1], Resampling.nearest)
            if read is None:
                continue
            data, transform, _ = read
            rasterio.warp.reproject(
                source=data[0],
                destination=codes,
                src_transform=transform,
                src_crs=src.crs,
                src_nodata=NODATA_CODE,
                dst_transform=grid.transform,
                dst_crs=grid.crs,
                dst_nodata=NODATA_CODE,
                resampling=Resampling.nearest,
            )
        np.copyto(out, codes, where=out == NODATA_CODE)
    return out


def read_imagery(images: Sequence[Located], grid: DisplayGrid) -> RGBA | None:
    """The images mosaicked on `grid` as RGBA (the first image that covers a pixel wins;
    transparent where none does): bands red, green, blue (the first three, or those the file
    calls so; one band is shown as grey), averaged from the overview level that fits. Pixels
    0 in every band, or masked by the file, are transparent. None when no image covers the
    grid."""
    out = np.zeros((grid.height, grid.width, 4), dtype=np.uint8)
    covered = False
    for image in images:
        if not image.touches(grid):
            continue
        try:
            rgba = _image_on_grid(image.path, grid)
        except rasterio.errors.RasterioIOError as exc:
            logger.warning("cannot read the image %s: %s", image.path, str(exc).splitlines()[0])
            continue
        if rgba is None:
            continue
        empty = out[..., 3] == 0
        np.copyto(out, rgba, where=empty[..., None])
        covered = True
        if not (out[..., 3] == 0).any():
            break
    return out if covered else None


def class_colours(class_map: ClassMap) -> npt.NDArray[np.uint8]:
    """A 256 x 4 RGBA lookup table of the class colours; code 0 and codes outside the table
    are transparent."""
    table = np.zeros((256, 4), dtype=np.uint8)
    for info in class_map.classes:
        if info.code != NODATA_CODE:
            table[info.code] = (*info.color, 255)
    return table


def class_rgba(codes: npt.NDArray[np.uint8], class_map: ClassMap) -> RGBA:
    """`codes` coloured with the class colours (RGBA; nodata transparent)."""
    rgba: RGBA = class_colours(class_map)[codes]
    return rgba


def classes_png(codes: npt.NDArray[np.uint8], class_map: ClassMap) -> bytes:
    """PNG of class codes as a palette image in the class colours (nodata and codes outside
    the table transparent): one byte per pixel, what makes large class pictures cheap to
    encode and small to embed."""
    table = class_colours(class_map)
    image = Image.fromarray(codes, mode="P")
    image.putpalette(table[:, :3].tobytes(), rawmode="RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", transparency=table[:, 3].tobytes(), compress_level=6)
    return buffer.getvalue()


def webp_bytes(rgba: RGBA, *, quality: int = 80) -> bytes:
    """Lossy WebP (with alpha) of an RGBA photo: imagery at a tenth of its PNG size."""
    buffer = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(buffer, format="WEBP", quality=quality, method=4)
    return buffer.getvalue()


def data_uri(data: bytes, media_type: str) -> str:
    """`data:` URI of `data`, for pages that must work without any other file."""
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def _decimated(
    src: rasterio.io.DatasetReader,
    grid: DisplayGrid,
    bands: list[int],
    resampling: Resampling,
) -> tuple[npt.NDArray[np.generic], Affine, rasterio.windows.Window] | None:
    """`bands` of `src` under `grid` (plus a pixel of margin), read at about the grid's pixel
    size, with the transform of the pixels read and the window of `src` they cover; None when
    `src` does not reach the grid."""
    bounds = grid.bounds
    if src.crs != grid.crs:
        bounds = rasterio.warp.transform_bounds(grid.crs, src.crs, *bounds, densify_pts=21)
    read_window = covering_window(bounds, src.transform, src.height, src.width)
    if read_window is None:
        return None
    # The display pixel measured in source pixels: how much the read may be decimated.
    window = rasterio.windows.from_bounds(*bounds, transform=src.transform)
    per_display_px = max(
        (window.width / max(grid.width, 1)),
        (window.height / max(grid.height, 1)),
    )
    factor = max(1.0, per_display_px)
    height, width = int(read_window.height), int(read_window.width)
    out_h, out_w = max(1, round(height / factor)), max(1, round(width / factor))
    data = src.read(
        bands, window=read_window, out_shape=(len(bands), out_h, out_w), resampling=resampling
    )
    transform = rasterio.windows.transform(read_window, src.transform) @ Affine.scale(
        width / out_w, height / out_h
    )
    return data, transform, read_window


def _image_on_grid(path: str, grid: DisplayGrid) -> RGBA | None:
    with rasterio.open(path) as src:
        bands = _rgb_bands(src)
        read = _decimated(src, grid, bands, Resampling.average)
        if read is None:
            return None
        data, transform, read_window = read
        rgb = _to_uint8(data)
        if len(bands) == 1:
            rgb = np.repeat(rgb, 3, axis=0)
        mask = src.dataset_mask(window=read_window, out_shape=data.shape[1:])
        alpha = np.where((rgb != 0).any(axis=0) & (mask > 0), 255, 0).astype(np.uint8)
        src_rgba = np.concatenate([rgb, alpha[None]], axis=0)
        dst = np.zeros((4, grid.height, grid.width), dtype=np.uint8)
        rasterio.warp.reproject(
            source=src_rgba,
            destination=dst,
            src_transform=transform,
            src_crs=src.crs,
            dst_transform=grid.transform,
            dst_crs=grid.crs,
            resampling=Resampling.bilinear,
        )
    dst[3] = np.where(dst[3] >= 128, 255, 0)
    if not dst[3].any():
        return None
    rgba: RGBA = np.ascontiguousarray(np.moveaxis(dst, 0, -1))
    return rgba


def _rgb_bands(src: rasterio.io.DatasetReader) -> list[int]:
    interp = list(src.colorinterp)
    named = [
        interp.index(c) + 1
        for c in (ColorInterp.red, ColorInterp.green, ColorInterp.blue)
        if c in interp
    ]
    if len(named) == 3:
        return named
    return [1, 2, 3] if src.count >= 3 else [1]


def _to_uint8(data: npt.NDArray[np.generic]) -> npt.NDArray[np.uint8]:
    """uint8 as it is; other types stretched from their 2nd to 98th percentile of non-zero
    values to 1..255 (0 stays the no-data value)."""
    if data.dtype == np.uint8:
        return data.astype(np.uint8, copy=False)
    values = data.astype(np.float64)
    valid = values[values != 0]
    if valid.size == 0:
        return np.zeros(data.shape, dtype=np.uint8)
    low, high = np.percentile(valid, [2, 98])
    scaled = np.clip((values - low) / max(high - low, 1e-12) * 254 + 1, 1, 255)
    scaled[values == 0] = 0
    stretched: npt.NDArray[np.uint8] = scaled.astype(np.uint8)
    return stretched
