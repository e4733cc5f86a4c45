"""`landcover view` benchmark: a county-sized map, drawn from its overviews, against the same
map without overviews (GDAL then decimates the full-resolution array), side by side.

Writes a synthetic land-cover map of SIZE x SIZE px (blocky classes, 512 px blocks) twice: as
a COG with mode overviews (what `predict` writes) and as a tiled GeoTIFF without overviews.
For each it times the page (`build_page`) and the exact class areas in it (every pixel,
`class_areas`, timed alone and taken off the page's time for its pictures), and prints the
ratios: pictures without overviews / with,
areas / pictures, page bytes / map bytes.

Usage: python benchmarks/bench_view.py [--size PX] [--detail PX]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
import rasterio.shutil
from affine import Affine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from landcover.prediction.outgrid import TAG_CLASS_MAP
from landcover.view import ViewConfig, build_page, class_areas, open_map
from tiling.sources.classes import get_class_map

FIVE = get_class_map("chesapeake7to5")


def write_maps(folder: Path, size: int) -> tuple[Path, Path]:
    """The map as a tiled GeoTIFF without overviews and as a COG with mode overviews."""
    plain = folder / "plain.tif"
    rng = np.random.default_rng(0)
    with rasterio.open(
        plain,
        "w",
        driver="GTiff",
        width=size,
        height=size,
        count=1,
        dtype="uint8",
        crs="EPSG:32618",
        transform=Affine(1.0, 0, 500_000.0, 0, -1.0, 4_300_000.0),
        nodata=0,
        tiled=True,
        blockxsize=512,
        blockysize=512,
        compress="deflate",
    ) as dst:
        dst.update_tags(**{TAG_CLASS_MAP: json.dumps(FIVE.to_json())})
        for row0 in range(0, size, 2048):
            rows = min(2048, size - row0)
            coarse = rng.integers(1, 5, size=(rows // 32 + 1, size // 32 + 1), dtype=np.uint8)
            strip = np.repeat(np.repeat(coarse, 32, axis=0), 32, axis=1)[:rows, :size]
            dst.write(strip, 1, window=rasterio.windows.Window(0, row0, size, rows))
    cog = folder / "cog.tif"
    rasterio.shutil.copy(
        plain, cog, driver="COG", BLOCKSIZE=512, OVERVIEW_RESAMPLING="MODE", COMPRESS="DEFLATE"
    )
    return plain, cog


def timed_page(path: Path, detail: int) -> tuple[float, float, int]:
    """Seconds of the whole page, of its exact areas alone, and the page's bytes."""
    map_file = open_map(str(path))
    started = time.perf_counter()
    page = build_page(ViewConfig(maps=(map_file,), imagery=(), detail_px=detail))
    page_s = time.perf_counter() - started
    started = time.perf_counter()
    areas = class_areas(map_file)
    areas_s = time.perf_counter() - started
    assert sum(a.pixels for a in areas) == map_file.width * map_file.height
    return page_s, areas_s, len(page.html.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16_384, help="map side in px")
    parser.add_argument("--detail", type=int, default=2048, help="--detail of the page")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-view-") as scratch:
        started = time.perf_counter()
        plain, cog = write_maps(Path(scratch), args.size)
        print(
            f"wrote a {args.size:,} x {args.size:,} px map in {time.perf_counter() - started:.1f} s"
        )
        cog_page_s, cog_areas_s, page_bytes = timed_page(cog, args.detail)
        plain_page_s, plain_areas_s, _ = timed_page(plain, args.detail)
        cog_s, plain_s = cog_page_s - cog_areas_s, plain_page_s - plain_areas_s
        print(f"pictures from overviews: {cog_s:.2f} s; without overviews: {plain_s:.2f} s")
        print(f"ratio without / with overviews: {plain_s / cog_s:.1f}x")
        print(
            f"exact areas (every pixel): {cog_areas_s:.2f} s = {cog_areas_s / cog_s:.1f}x "
            "the pictures"
        )
        print(
            f"page {page_bytes / 1e6:.2f} MB = {page_bytes / cog.stat().st_size:.3f}x the COG's "
            f"{cog.stat().st_size / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
