"""The Dask engine's task overheads: tile's sources as tasks against the local engine.

The same N tiny synthetic scenes (`tiling.synthetic.scenes`, 256 px, 64 px chips: the cutting itself
is cheap, so what is left is the per-unit cost) are tiled

- by one process (`tile(config)`, 2 reader threads): the baseline;
- by the local engine's 2 ranks (`landcover tile --nproc 2`, a subprocess: its start is
  counted, as a user's command counts it);
- as N tasks on a running LocalCluster of 2 single-threaded workers
  (`tile(config, run_units=TaskRunner(client))`: each source cut and staged by a task, the
  parts appended here), the cluster's start not counted (a Dask user's cluster is running);

for two values of N, and N no-op tasks go through the same `TaskRunner` (submit, retries,
progress, results in order): the pure per-task cost of the scheduler. Then predict's unit: a
tiled product (`predict --out DIR/ --tile-size PX`) of one scene and an untrained small_unet,
cut into N tiles for two tile sizes, by one process and as N tasks on the same cluster
(`predict_product(setup, run_units=...)`), with the tiles' pixels compared. Prints per-source
seconds, the ratios to one process and to the local engine, the slope between the two N
(the marginal cost of one more source, which removes the fixed costs), and whether every
store is byte-identical to one process's. Best of `--repeat`. Never asserts on time.

    python benchmarks/bench_dask.py [--sources 8,32] [--tiles 64,32] [--repeat 2]
        [--json benchmarks/results/dask.json]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import rasterio
from distributed import Client, LocalCluster

from cluster.dask.client import TaskRunner
from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from landcover.prediction.config import PredictConfig
from landcover.prediction.tiled import predict_product
from landcover.prediction.tileplan import TiledSetup
from tiling.sources.classes import DEFAULT_CLASS_MAP, get_class_map
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

SIZE_PX = 256
CHIP = 64


def noop(unit: int) -> int:
    return unit


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(
    work: Path, image_paths: list[Path], label_paths: list[Path], runner: TaskRunner, repeat: int
) -> tuple[int, float, float, float, bool]:
    """(sources, one process s, local engine s, dask tasks s, all stores identical)."""
    n = len(image_paths)
    images = tuple(str(p) for p in image_paths)
    labels = tuple(str(p) for p in label_paths)

    def config(name: str) -> TileConfig:
        return TileConfig(
            images=images, labels=labels, out=str(work / f"{name}-{n}.zarr"), chip_size=CHIP,
            workers=2, overwrite=True,
        )  # fmt: skip

    one_s = best(repeat, lambda: tile(config("one")))
    ranks_out = work / f"ranks-{n}.zarr"
    command = [sys.executable, "-m", "landcover", "-q", "tile", *images,
               *(arg for label in labels for arg in ("--labels", label)), "--out",
               str(ranks_out), "--chip-size", str(CHIP), "--nproc", "2", "--overwrite"]  # fmt: skip
    ranks_s = best(repeat, lambda: subprocess.run(command, check=True))
    tasks_s = best(repeat, lambda: tile(config("tasks"), run_units=runner))
    reference = files(work / f"one-{n}.zarr")
    same = files(work / f"tasks-{n}.zarr") == reference and files(ranks_out) == reference
    return n, one_s, ranks_s, tasks_s, same


def untrained_model(path: Path) -> Path:
    """A small_unet model file with random weights (prediction costs the same)."""
    class_map = get_class_map(DEFAULT_CLASS_MAP)
    meta = ModelMeta("small_unet", class_map, ("red", "green", "blue", "nir"), (110.0,) * 4,
                     (60.0,) * 4, chip_size=CHIP, resolution_m=1.0)  # fmt: skip
    save_model_file(path, build_model("small_unet", num_classes=class_map.num_classes), meta)
    return path


def tile_pixels(folder: Path) -> dict[str, bytes]:
    pixels = {}
    for tif in sorted(folder.glob("E*_N*.tif")):
        with rasterio.open(tif) as ds:
            pixels[tif.name] = ds.read().tobytes()
    return pixels


def measure_tiles(
    work: Path, model: Path, image: Path, tile_px: int, runner: TaskRunner, repeat: int
) -> tuple[int, float, float, bool]:
    """(tiles, one process s, dask tasks s, same tiles) of a tiled product of `image`."""

    def setup(name: str) -> TiledSetup:
        out = work / f"{name}-{tile_px}"
        shutil.rmtree(out, ignore_errors=True)  # every repeat predicts every tile
        config = PredictConfig(model=str(model), images=(str(image),), out=f"{out}/",
                               block_px=256, progress=False)  # fmt: skip
        return TiledSetup(config, tile_px)

    one_s = best(repeat, lambda: predict_product(setup("one")))
    tasks_s = best(repeat, lambda: predict_product(setup("tasks"), run_units=runner))
    one = tile_pixels(work / f"one-{tile_px}")
    return len(one), one_s, tasks_s, tile_pixels(work / f"tasks-{tile_px}") == one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="8,32", help="source counts, e.g. 8,32")
    parser.add_argument("--tiles", default="64,32", help="tile sizes in px of a tiled predict")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    counts = [int(n) for n in args.sources.split(",")]
    tile_sizes = [int(n) for n in args.tiles.split(",")]
    tile_rows = []
    work = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    rows = []
    noops = []
    try:
        scenes = synthesize_scenes(
            SynthConfig(out_dir=work / "scenes", scenes=max(counts), size_px=SIZE_PX, seed=0)
        )
        with (
            LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,  # type: ignore[no-untyped-call]
        ):
            runner = TaskRunner(client, show_progress=False)
            runner(noop, list(range(4)))  # the workers' first task imports what they need
            for n in counts:
                rows.append(measure(work, scenes.image_paths[:n], scenes.label_paths[:n], runner,
                                    args.repeat))  # fmt: skip
                units = list(range(n))
                noops.append((n, best(args.repeat, partial(runner, noop, units))))
            model = untrained_model(work / "model.pt")
            for tile_px in tile_sizes:
                tile_rows.append(measure_tiles(work, model, scenes.image_paths[0], tile_px,
                                               runner, args.repeat))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("## Tile: sources as Dask tasks against one process and the local engine\n")
    print("| sources | one process s/source | local engine (2 ranks) s/source | "
          "dask tasks (2 workers) s/source | dask / one process | dask / local engine | "
          "identical |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n, one_s, ranks_s, tasks_s, same in rows:
        print(f"| {n} | {one_s / n:.3f} | {ranks_s / n:.3f} | {tasks_s / n:.3f} | "
              f"{tasks_s / one_s:.2f}x | {tasks_s / ranks_s:.2f}x | {same} |")  # fmt: skip
    if len(rows) >= 2:
        (n0, one0, ranks0, tasks0, _), (n1, one1, ranks1, tasks1, _) = rows[0], rows[-1]
        extra = n1 - n0
        print("\n## Tile: the cost of one more source (slope between the source counts)\n")
        print("| one process s | local engine s | dask tasks s | dask / one process | "
              "dask / local engine |")  # fmt: skip
        print("|---|---|---|---|---|")
        one_d, ranks_d, tasks_d = (
            (one1 - one0) / extra,
            (ranks1 - ranks0) / extra,
            (tasks1 - tasks0) / extra,
        )
        print(f"| {one_d:.3f} | {ranks_d:.3f} | {tasks_d:.3f} | {tasks_d / one_d:.2f}x | "
              f"{tasks_d / ranks_d:.2f}x |")  # fmt: skip
    print("\n## Per-task cost of the scheduler (no-op tasks through TaskRunner)\n")
    print("| tasks | ms per task | share of a dask source's time |")
    print("|---|---|---|")
    for (n, noop_s), (_, _, _, tasks_s, _) in zip(noops, rows, strict=True):
        print(f"| {n} | {1000 * noop_s / n:.1f} | {noop_s / tasks_s:.2f} |")
    print(f"\n## Predict: the tiles of a tiled product as Dask tasks ({SIZE_PX} px scene)\n")
    print("| tile px | tiles | one process s/tile | dask tasks (2 workers) s/tile | "
          "dask / one process | identical |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for tile_px, (n, one_s, tasks_s, same) in zip(tile_sizes, tile_rows, strict=True):
        print(f"| {tile_px} | {n} | {one_s / n:.3f} | {tasks_s / n:.3f} | "
              f"{tasks_s / one_s:.2f}x | {same} |")  # fmt: skip
    if len(tile_rows) >= 2:
        (n0, one0, tasks0, _), (n1, one1, tasks1, _) = tile_rows[0], tile_rows[-1]
        print("\n## Predict: the cost of one more tile of the same scene (slope)\n")
        print("| one process s | dask tasks s |")
        print("|---|---|")
        print(f"| {(one1 - one0) / (n1 - n0):.3f} | {(tasks1 - tasks0) / (n1 - n0):.3f} |")
    return 0


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_dask.py"):
        sys.exit(main())
