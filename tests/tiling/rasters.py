"""Tiny GeoTIFFs for the tiling tests, written with a fixed seed.

Sizes are deliberately not multiples of the chip sizes the tests use, so edge chips are
exercised. Pixel values avoid 0 unless a test wants nodata.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.windows
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import ColorInterp

UTM18 = "EPSG:26918"
ALBERS = "EPSG:5070"
ORIGIN_E, ORIGIN_N = 370_000.0, 4_300_000.0
CHESAPEAKE_RAW = np.array([1, 2, 3, 4, 5, 6], dtype=np.uint8)
NLCD_RAW = np.array([11, 21, 22, 41, 42, 52, 71, 81, 82, 90], dtype=np.uint8)


def image_pixels(height: int, width: int, *, seed: int, bands: int = 4) -> npt.NDArray[np.uint8]:
    """Smooth-ish random imagery in 1..255 (so 0 is free to mean nodata)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(1, 256, size=(bands, height // 8 + 2, width // 8 + 2))
    up = np.repeat(np.repeat(base, 8, axis=1), 8, axis=2)[:, :height, :width]
    noise = rng.integers(-12, 13, size=(bands, height, width))
    return np.clip(up + noise, 1, 255).astype(np.uint8)


def full_window(info: Any) -> rasterio.windows.Window:
    """The window of a whole raster (a `RasterInfo` or an open dataset)."""
    return rasterio.windows.Window(0, 0, info.width, info.height)


def write_raster(
    path: Path,
    data: npt.NDArray[Any],
    *,
    crs: str | None = UTM18,
    transform: Affine | None = None,
    nodata: float | None = None,
    alpha_last: bool = False,
    tiled: bool = False,
) -> Path:
    """Write `data` (bands, h, w) or (h, w) as a GeoTIFF."""
    arr = data if data.ndim == 3 else data[None]
    count, height, width = arr.shape
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "height": height,
        "width": width,
        "count": count,
        "dtype": arr.dtype.name,
        "crs": CRS.from_user_input(crs) if crs else None,
        "transform": transform or Affine(1.0, 0, ORIGIN_E, 0, -1.0, ORIGIN_N),
        "nodata": nodata,
        "compress": "deflate",
    }
    if tiled:
        profile.update(tiled=True, blockxsize=64, blockysize=64)
    if alpha_last:
        profile["photometric"] = "RGB"
        profile["alpha"] = "UNSPECIFIED"
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.Env(GDAL_PAM_ENABLED="NO"), rasterio.open(path, "w", **profile) as ds:
        ds.write(arr)
        if alpha_last and count == 4:
            ds.colorinterp = (
                ColorInterp.red,
                ColorInterp.green,
                ColorInterp.blue,
                ColorInterp.alpha,
            )
    return path


def blocky_codes(
    height: int, width: int, values: npt.NDArray[np.uint8], *, seed: int, block: int = 7
) -> npt.NDArray[np.uint8]:
    """Class codes in blocks of `block` pixels, drawn from `values`."""
    rng = np.random.default_rng(seed)
    coarse = rng.choice(values, size=(height // block + 1, width // block + 1))
    return np.repeat(np.repeat(coarse, block, axis=0), block, axis=1)[:height, :width]


@dataclass(frozen=True)
class Scenes:
    """Two adjacent images, Chesapeake labels in two tiles and an NLCD raster in Albers."""

    images: tuple[Path, ...]
    image_pixels: tuple[npt.NDArray[np.uint8], ...]
    chesapeake: tuple[Path, ...]
    nlcd: Path
    root: Path


def make_scenes(root: Path) -> Scenes:
    """Image A 300 x 413 (no nodata), image B 257 x 390 to its right with a nodata corner.

    Chesapeake labels (1 m, UTM 18N) come as two tiles split at a line that cuts through
    image A, so matching by file name would fail and footprints must be used; tile 1 has a
    nodata (15) stripe. The NLCD raster is 30 m in EPSG:5070 and covers both images.
    """
    a = image_pixels(300, 413, seed=1)
    b = image_pixels(257, 390, seed=2)
    b[:, :80, :120] = 0
    ta = Affine(1.0, 0, ORIGIN_E, 0, -1.0, ORIGIN_N)
    tb = Affine(1.0, 0, ORIGIN_E + 413, 0, -1.0, ORIGIN_N - 20)
    images = (
        write_raster(root / "naip" / "a.tif", a, transform=ta),
        write_raster(root / "naip" / "b.tif", b, transform=tb, nodata=0, tiled=True),
    )
    # Label tiles: x in [E-10, E+250) and [E+250, E+830), y in [N-300, N+10).
    lab0 = blocky_codes(310, 260, CHESAPEAKE_RAW, seed=3)
    lab1 = blocky_codes(310, 580, CHESAPEAKE_RAW, seed=4)
    lab1[100:110, :] = 15
    chesapeake = (
        write_raster(
            root / "labels" / "tile_1.tif",
            lab1,
            transform=Affine(1.0, 0, ORIGIN_E + 250, 0, -1.0, ORIGIN_N + 10),
        ),
        write_raster(
            root / "labels" / "tile_0.tif",
            lab0,
            transform=Affine(1.0, 0, ORIGIN_E - 10, 0, -1.0, ORIGIN_N + 10),
        ),
    )
    nlcd = write_nlcd_cover(root / "nlcd" / "nlcd.tif", images, seed=5)
    return Scenes(
        images=images,
        image_pixels=(a, b),
        chesapeake=chesapeake,
        nlcd=nlcd,
        root=root,
    )


def write_nlcd_cover(path: Path, images: tuple[Path, ...], *, seed: int) -> Path:
    """A 30 m EPSG:5070 NLCD-like raster covering every image in `images`, nodata 0."""
    from rasterio.warp import transform_bounds

    lefts, bottoms, rights, tops = [], [], [], []
    for image in images:
        with rasterio.open(image) as ds:
            left, bottom, right, top = transform_bounds(ds.crs, ALBERS, *ds.bounds)
        lefts.append(left)
        bottoms.append(bottom)
        rights.append(right)
        tops.append(top)
    left = np.floor(min(lefts) / 30) * 30 - 90
    top = np.ceil(max(tops) / 30) * 30 + 90
    width = int(np.ceil((max(rights) - left) / 30)) + 3
    height = int(np.ceil((top - min(bottoms)) / 30)) + 3
    codes = blocky_codes(height, width, NLCD_RAW, seed=seed, block=1)
    return write_raster(
        path, codes, crs=ALBERS, transform=Affine(30.0, 0, left, 0, -30.0, top), nodata=0
    )
