"""State counts on this machine: the cost per source of `landcover tile` against the count.

A whole state is thousands of sources (Virginia: ~4,000 NAIP quarter-quads in UTM 17N and
18N, labels in CONUS Albers). Pixels are not what this measures, so every source is a small
VRT over one file (`statemosaic.build_state_mosaic`): images in UTM 18N, 1 m label tiles in
EPSG:5070. For each count N it runs, in a fresh process each:

- plan: `tiling.plan.plan_tiling` alone (inputs opened, labels matched, split decided);
- tile: `tiling.tile.tile`, one worker, the whole run (plan, cut, commit);

and prints seconds, milliseconds per source, and the ratio of the per-source cost to that
at the smallest N (1.0 = linear in N; a cost that grows with N shows as a ratio above 1).
Then the footprint-planning count alone (`--footprints`, default 40,000): the label index
built and every image matched, no files opened.

Usage: python benchmarks/bench_state.py [--counts 160,1600] [--footprints 40000]
Never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(kind: str, n: int) -> None:
    """Runs in its own process: build the mosaic, time one stage, print JSON."""
    import resource
    import warnings

    sys.path.insert(0, str(HERE))
    from statemosaic import build_state_mosaic

    from tiling.plan import TileConfig, plan_tiling
    from tiling.tile import tile

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix="bench_state_") as tmp:
        mosaic = build_state_mosaic(Path(tmp), n)
        config = TileConfig(
            images=tuple(str(p) for p in mosaic.images),
            labels=tuple(str(p) for p in mosaic.labels),
            out=str(Path(tmp) / "chips.zarr"),
            chip_size=64,
            min_valid=0.0,
            workers=1,
        )
        start = time.perf_counter()
        if kind == "plan":
            plan_tiling(config)
        else:
            tile(config)
        seconds = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"n": n, "labels": len(mosaic.labels), "s": seconds, "rss": rss}))


def _footprints(n: int) -> tuple[float, int, int]:
    """Seconds to index the label tiles and match `n` image footprints, and the matches."""
    from affine import Affine
    from rasterio.crs import CRS
    from rasterio.warp import transform_bounds

    from tiling.labels import LabelIndex
    from tiling.sources import RasterInfo

    utm, albers = CRS.from_epsg(26918), CRS.from_epsg(5070)
    side = int(n**0.5) + 1

    def info(path: str, crs: CRS, x: float, y: float, size: int, count: int) -> RasterInfo:
        return RasterInfo(
            path=path, crs=crs, transform=Affine(1, 0, x, 0, -1, y), width=size, height=size,
            count=count, dtype="uint8", nodata=None, block_shape=(256, 256), mask_kind="none",
        )  # fmt: skip

    images = [
        info(f"i{k}", utm, 300_000 + (k % side) * 248, 4_400_000 - (k // side) * 248, 256, 4)
        for k in range(n)
    ]
    extent = (300_000, 4_400_000 - side * 248, 300_000 + side * 248 + 256, 4_400_000)
    left, bottom, right, top = transform_bounds(utm, albers, *extent)
    tile_m = 2048
    labels = [
        info(f"l{j}-{i}", albers, left + i * tile_m, top - j * tile_m, tile_m, 1)
        for j in range(int((top - bottom) // tile_m) + 1)
        for i in range(int((right - left) // tile_m) + 1)
    ]
    start = time.perf_counter()
    index = LabelIndex(labels)
    matched = sum(len(index.match(image)) for image in images)
    return time.perf_counter() - start, matched, len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", default="160,1600")
    parser.add_argument("--footprints", type=int, default=40_000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    counts = sorted(int(c) for c in args.counts.split(","))
    print(f"# bench_state — {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    print("sources: 256 px VRTs in UTM 18N; labels: 2048 px VRT tiles in EPSG:5070; 64 px chips")
    print()
    print(
        "| stage | N sources | label tiles | s | ms/source | ratio to smallest N | peak RSS MiB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in ("plan", "tile"):
        base = None
        for n in counts:
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(n)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                print(f"| {kind} | {n} | failed: {done.stderr.strip().splitlines()[-1]} |||||")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            per = 1e3 * row["s"] / n
            base = base or per
            print(
                f"| {kind} | {n} | {row['labels']} | {row['s']:.1f} | {per:.1f} "
                f"| {per / base:.2f} | {row['rss'] / 2**20:.0f} |"
            )
    if args.footprints:
        seconds, matched, tiles = _footprints(args.footprints)
        print()
        print(
            f"footprints: {args.footprints} images matched against {tiles} label tiles "
            f"({matched} matches) in {seconds:.1f} s ({1e6 * seconds / args.footprints:.0f} "
            "µs per image)"
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
