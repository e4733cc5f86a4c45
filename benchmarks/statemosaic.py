"""A synthetic state mosaic at state *counts* with cheap pixels: thousands of small image
sources and the label tiles under them, every one a VRT over ONE small file.

- Images: `n` VRTs in UTM 18N (EPSG:26918), `size_px` square at 1 m, laid row by row on a
  grid with a little overlap (as NAIP quarter-quads overlap), each pointing at the same
  4-band GeoTIFF. Their pixels are identical; what grows with `n` is the count.
- Labels: 1 m tiles in CONUS Albers (EPSG:5070), as the Chesapeake land cover is shipped,
  each `label_px` square, covering the images' footprint, each a VRT over one label file.
  Images and labels are in different CRSs, so matching them needs a transform per pair of
  CRSs and a spatial query per image.

Used by `bench_state.py`; it writes only under the folder it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform_bounds

IMAGE_CRS = CRS.from_epsg(26918)
LABEL_CRS = CRS.from_epsg(5070)
ORIGIN_E, ORIGIN_N = 300_000.0, 4_400_000.0  # northern Virginia, UTM 18N
OVERLAP_PX = 8


@dataclass(frozen=True)
class StateMosaic:
    images: list[Path]
    labels: list[Path]
    bounds_utm: tuple[float, float, float, float]


def _vrt(path: Path, source: Path, *, crs: CRS, transform: Affine, size: int, bands: int) -> None:
    band_xml = "".join(
        f'<VRTRasterBand dataType="Byte" band="{b}"><SimpleSource>'
        f'<SourceFilename relativeToVRT="0">{source}</SourceFilename>'
        f"<SourceBand>{b}</SourceBand>"
        f'<SrcRect xOff="0" yOff="0" xSize="{size}" ySize="{size}"/>'
        f'<DstRect xOff="0" yOff="0" xSize="{size}" ySize="{size}"/>'
        "</SimpleSource></VRTRasterBand>"
        for b in range(1, bands + 1)
    )
    gt = ", ".join(repr(v) for v in transform.to_gdal())
    path.write_text(
        f'<VRTDataset rasterXSize="{size}" rasterYSize="{size}">'
        f"<SRS>{crs.to_wkt()}</SRS><GeoTransform>{gt}</GeoTransform>{band_xml}</VRTDataset>"
    )


def _write_tif(path: Path, pixels: np.ndarray, crs: CRS) -> None:
    """The one small file every VRT of a kind points at (its own placement is never read)."""
    bands, height, width = pixels.shape
    with rasterio.open(
        path, "w", driver="GTiff", width=width, height=height, count=bands, dtype="uint8",
        crs=crs, transform=Affine(1, 0, 0, 0, -1, 0), tiled=True, blockxsize=256, blockysize=256,
    ) as dst:  # fmt: skip
        dst.write(pixels)


def build_state_mosaic(
    folder: Path, n: int, *, size_px: int = 256, label_px: int = 2048, seed: int = 0
) -> StateMosaic:
    """`n` image VRTs and the label VRTs that cover them, under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    image_file = folder / "base-image.tif"
    _write_tif(image_file, rng.integers(1, 255, size=(4, size_px, size_px), dtype=np.uint8),
               IMAGE_CRS)  # fmt: skip
    cols = math.ceil(math.sqrt(n))
    step = size_px - OVERLAP_PX
    images = []
    (folder / "naip").mkdir(exist_ok=True)
    for k in range(n):
        r, c = divmod(k, cols)
        transform = Affine(1, 0, ORIGIN_E + c * step, 0, -1, ORIGIN_N - r * step)
        path = folder / "naip" / f"m_{k:05d}.vrt"
        _vrt(path, image_file, crs=IMAGE_CRS, transform=transform, size=size_px, bands=4)
        images.append(path)
    rows = math.ceil(n / cols)
    bounds_utm = (
        ORIGIN_E,
        ORIGIN_N - (rows - 1) * step - size_px,
        ORIGIN_E + (cols - 1) * step + size_px,
        ORIGIN_N,
    )
    left, bottom, right, top = transform_bounds(IMAGE_CRS, LABEL_CRS, *bounds_utm)
    label_file = folder / "base-labels.tif"
    _write_tif(label_file, rng.integers(1, 7, size=(1, label_px, label_px), dtype=np.uint8),
               LABEL_CRS)  # fmt: skip
    (folder / "labels").mkdir(exist_ok=True)
    labels = []
    x0, y0 = math.floor(left), math.ceil(top)
    for j in range(math.ceil((top - bottom) / label_px)):
        for i in range(math.ceil((right - left) / label_px)):
            transform = Affine(1, 0, x0 + i * label_px, 0, -1, y0 - j * label_px)
            path = folder / "labels" / f"lc_{j:03d}_{i:03d}.vrt"
            _vrt(path, label_file, crs=LABEL_CRS, transform=transform, size=label_px, bands=1)
            labels.append(path)
    return StateMosaic(images=images, labels=labels, bounds_utm=bounds_utm)


def main() -> None:
    """`python benchmarks/statemosaic.py DIR --sources N`: write a mosaic under DIR."""
    import argparse

    parser = argparse.ArgumentParser(description="Write a synthetic state mosaic of VRTs.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--sources", type=int, default=40)
    parser.add_argument("--size-px", type=int, default=256)
    args = parser.parse_args()
    mosaic = build_state_mosaic(args.folder, args.sources, size_px=args.size_px)
    print(
        f"wrote {len(mosaic.images)} image VRTs in {args.folder / 'naip'} (UTM 18N) and "
        f"{len(mosaic.labels)} label VRTs in {args.folder / 'labels'} (EPSG:5070)"
    )


if __name__ == "__main__":
    main()
