"""A small land-cover COG with known class counts and overviews, the image it is "predicted"
from, a tiled product of two such maps side by side (a VRT mosaic in a directory), and the
areas of a map's classes on the ellipsoid, pixel by pixel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.shutil
from affine import Affine
from pyproj import Geod, Transformer

from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_SOURCES
from tiling.sources.classes import ClassMap, get_class_map

UTM = "EPSG:32618"
X0, Y0 = 500_000.0, 4_000_000.0
RES_M = 2.0
FIVE = get_class_map("chesapeake7to5")


def class_blocks(height: int, width: int, *, seed: int) -> npt.NDArray[np.uint8]:
    """Codes 1..4 in blocks of 8 px with a nodata (0) column strip at the right edge."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(1, 5, size=(height // 8 + 1, width // 8 + 1))
    codes = np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)[:height, :width]
    codes[:, width - width // 10 :] = 0
    return codes.astype(np.uint8)


def write_map(
    path: Path,
    codes: npt.NDArray[np.uint8],
    *,
    sources: list[str] | None = None,
    x0: float = X0,
    y0: float = Y0,
    res: float = RES_M,
    crs: str = UTM,
    class_map: ClassMap = FIVE,
) -> Path:
    """`codes` as a tagged land-cover COG (class table `class_map`) with mode overviews (128 px
    blocks: maps larger than that have overviews)."""
    tiled = path.with_suffix(".tiled.tif")
    with rasterio.open(
        tiled,
        "w",
        driver="GTiff",
        width=codes.shape[1],
        height=codes.shape[0],
        count=1,
        dtype="uint8",
        crs=crs,
        transform=Affine(res, 0, x0, 0, -res, y0),
        nodata=0,
    ) as dst:
        dst.write(codes, 1)
        tags = {TAG_CLASS_MAP: json.dumps(class_map.to_json())}
        if sources is not None:
            tags[TAG_SOURCES] = json.dumps(sources)
        dst.update_tags(**tags)
    rasterio.shutil.copy(
        tiled, path, driver="COG", BLOCKSIZE=128, OVERVIEW_RESAMPLING="MODE", COMPRESS="DEFLATE"
    )
    tiled.unlink()
    return path


def write_scene(path: Path, height_m: float, width_m: float, *, seed: int = 3) -> Path:
    """A 4-band uint8 image at 1 m from the map's corner (X0, Y0): blocky noise in 1..255."""
    height, width = int(height_m), int(width_m)
    rng = np.random.default_rng(seed)
    coarse = rng.integers(1, 256, size=(4, height // 6 + 1, width // 6 + 1), dtype=np.uint8)
    data = np.repeat(np.repeat(coarse, 6, axis=1), 6, axis=2)[:, :height, :width]
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=width,
        height=height,
        count=4,
        dtype="uint8",
        crs=UTM,
        transform=Affine(1.0, 0, X0, 0, -1.0, Y0),
    ) as dst:
        dst.write(data)
    return path


def write_mosaic(folder: Path, tiles: list[Path], width: int, height: int) -> Path:
    """`folder`/mosaic.vrt over `tiles` laid side by side (each `width` x `height` px)."""
    with rasterio.open(tiles[0]) as first:
        t = first.transform
    sources = "".join(
        f"""<SimpleSource><SourceFilename relativeToVRT="1">{tile.name}</SourceFilename>
<SourceBand>1</SourceBand><SrcRect xOff="0" yOff="0" xSize="{width}" ySize="{height}"/>
<DstRect xOff="{i * width}" yOff="0" xSize="{width}" ySize="{height}"/></SimpleSource>"""
        for i, tile in enumerate(tiles)
    )
    vrt = f"""<VRTDataset rasterXSize="{width * len(tiles)}" rasterYSize="{height}">
<SRS>{UTM}</SRS><GeoTransform>{t.c}, {t.a}, 0, {t.f}, 0, {t.e}</GeoTransform>
<VRTRasterBand dataType="Byte" band="1"><NoDataValue>0</NoDataValue>{sources}</VRTRasterBand>
</VRTDataset>"""
    path = folder / "mosaic.vrt"
    path.write_text(vrt)
    return path


def geodesic_areas(lc: Path, codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.float64]:
    """Square metres of each code 0..255: every pixel's corners on the ellipsoid, its area
    that of the geodesic polygon through them (pyproj.Geod, WGS 84)."""
    with rasterio.open(lc) as ds:
        t, crs = ds.transform, ds.crs
    to_lonlat = Transformer.from_crs(crs.to_wkt(), "EPSG:4326", always_xy=True)
    geod = Geod(ellps="WGS84")
    rows, cols = codes.shape
    cx, cy = np.meshgrid(np.arange(cols + 1), np.arange(rows + 1))
    lon, lat = to_lonlat.transform(t.c + t.a * cx, t.f + t.e * cy)
    area = np.zeros(256)
    for r in range(rows):
        for c in range(cols):
            ring_lon = [lon[r, c], lon[r, c + 1], lon[r + 1, c + 1], lon[r + 1, c]]
            ring_lat = [lat[r, c], lat[r, c + 1], lat[r + 1, c + 1], lat[r + 1, c]]
            pixel, _ = geod.polygon_area_perimeter(ring_lon, ring_lat)
            area[codes[r, c]] += abs(pixel)
    return area
