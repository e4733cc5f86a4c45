"""Distributed prediction benchmark: one region predicted by 1 rank and by 2 ranks.

Each rank is a subprocess with ONE torch thread (OMP/MKL threads 1), so what a rank has is
the same in both runs and the speed-up is the scale-out alone. The ranks import and wait for
a start signal first, so interpreter start-up is not timed. Printed per model (small_unet,
unet_resnet18; CPU):

- wall time and km²/min (at 1 m) for 1 and 2 ranks, km²/min per rank, the speed-up (goal
  >= 1.8x on 2 cores), the CPU seconds of all ranks together (equal for 1 and 2 ranks when
  the split adds no work: a speed-up short of 2x with equal CPU means busy cores), rank 0's
  wait for the other part, and the output step's share (1 rank: the COG; 2 ranks: rank 0's
  assembly, i.e. VRT over the parts + COG + removing the parts);
- the machine's limit for 2 ranks: 2 unrelated processes started together, each doing rank
  1's share of the 2-rank job (the same windows, its part written, nothing waited for), and
  the share of it 2 ranks reach. What they lose against one process doing it all is the cost
  of sharing the machine (memory bandwidth, caches), which no split removes;
- rank 0's assembly rate (Mpx/s) on a larger two-part class map;
- an estimate, from the measured per-rank rate, of the wall time to predict a state (4,000
  NAIP quarter-quads of ~44 km² at 1 m: 176,000 km²) on 16 and 64 nodes of 16 ranks each
  (one per core, as measured here), using the library's own row split of a state-shaped
  region: a rank runs whole block rows, so ranks beyond the block rows with work idle. The
  rate is carried over to other block sizes by the windows each runs (windows on the
  boundary between two block rows run once for each row: 1 + chip / block of the windows).

Usage: python benchmarks/bench_predict_ranks.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import rasterio
import shapely
import shapely.affinity
import torch
from affine import Affine
from machine import load_average
from rasterio.crs import CRS
from rasterio.windows import Window

from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from landcover.prediction.assemble import assemble
from landcover.prediction.blend import WindowLayout
from landcover.prediction.config import PredictConfig
from landcover.prediction.outfiles import OutputPaths, class_profile, describe_class_raster
from landcover.prediction.outgrid import GridPlan, OutputGrid
from landcover.prediction.parts import PartWriter, Staging
from landcover.prediction.ranks import RankShare, row_costs, split_rows
from landcover.prediction.setup import GDAL_CACHE_BYTES
from landcover.training.distributed import cpu_model_name
from tiling.sources.classes import get_class_map
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes

CHIP = 256
CLASS_MAP = get_class_map("chesapeake7to5")
STATE_FILES = 4000
FILE_KM2 = 44.0
RANKS_PER_NODE = 16

# A rank: imports, then waits for "go" on stdin; times predict_region and its output step.
_RANK = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
import landcover.prediction.distributed as distributed
import landcover.prediction.runner as runner
from landcover.prediction.config import PredictConfig
spent = {"output": 0.0, "wait": 0.0}
def timed(step, what):
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            spent[what] += time.perf_counter() - started
    return run
distributed.assemble = timed(distributed.assemble, "output")  # n ranks: rank 0's assembly
distributed.wait_for_parts = timed(distributed.wait_for_parts, "wait")
runner.write_cogs = timed(runner.write_cogs, "output")  # 1 rank: the COG
values = json.loads(sys.argv[1])
config = PredictConfig(**{**values, "images": tuple(values["images"])})
rank, world = int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
started, cpu = time.perf_counter(), time.process_time()
runner.predict_region(config, rank=rank, world_size=world)
print(json.dumps({"rank": rank, "seconds": time.perf_counter() - started,
                  "cpu_s": time.process_time() - cpu, "output_s": spent["output"],
                  "wait_s": spent["wait"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 1024 px scene, best of two")
    args = parser.parse_args()
    # Two block rows of equal work: one per rank with 2 ranks.
    side, rounds = (1024, 2) if args.quick else (2048, 3)
    block = side // 2
    with tempfile.TemporaryDirectory(prefix="bench_predict_ranks_") as tmp:
        work = Path(tmp)
        scene = synthesize_scenes(SynthConfig(work / "scene", scenes=1, size_px=side, seed=5))
        km2 = side * side / 1e6
        print(f"# bench_predict_ranks ({'quick' if args.quick else 'full'}) — {_machine()}")
        print()
        print(
            f"One {side} x {side} px scene at 1 m ({km2:.2f} km²), {block} px blocks "
            f"({side // block} block rows), chip {CHIP}, default overlap; best of {rounds} "
            "interleaved round(s); each rank one torch thread."
        )
        print()
        print(
            "| model | ranks | wall s | km²/min | km²/min per rank | speed-up | CPU s, all ranks "
            "| rank 0 waited s | output step s | output share |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        per_rank = {}
        limits: dict[str, tuple[float, float]] = {}
        for name in ("small_unet", "unet_resnet18"):
            model = work / f"{name}.pt"
            meta = ModelMeta(name, CLASS_MAP, ("red", "green", "blue", "nir"), (110.0,) * 4,
                             (60.0,) * 4, chip_size=CHIP, resolution_m=1.0)  # fmt: skip
            save_model_file(model, build_model(name, num_classes=CLASS_MAP.num_classes), meta)
            config = PredictConfig(
                str(model),
                (str(scene.image_paths[0]),),
                str(work / f"{name}.tif"),
                block_px=block,
                device="cpu",
                overwrite=True,
                progress=False,
            )
            # rank 1's share twice over, into two outputs: its work without rank 0
            limit_jobs = [
                (replace(config, out=str(work / f"{name}-{i}.tif")), 1, 2) for i in (0, 1)
            ]
            best: dict[int, Timing] = {}
            limit: Timing | None = None
            for _ in range(rounds):
                for ranks in (1, 2):
                    timing = _run(config, ranks)
                    if ranks not in best or timing.wall_s < best[ranks].wall_s:
                        best[ranks] = timing
                for job, _, _ in limit_jobs:  # no rank 0 removes its part: start afresh
                    shutil.rmtree(Staging(job.out).url, ignore_errors=True)
                timing = _run_jobs(limit_jobs)
                if limit is None or timing.wall_s < limit.wall_s:
                    limit = timing
            assert limit is not None
            limits[name] = (best[1].wall_s / limit.wall_s, limit.wall_s / best[2].wall_s)
            for ranks, t in sorted(best.items()):
                rate = km2 / (t.wall_s / 60)
                print(
                    f"| {name} | {ranks} | {t.wall_s:.1f} | {rate:.2f} | {rate / ranks:.2f} | "
                    f"{best[1].wall_s / t.wall_s:.2f}x | {t.cpu_s:.1f} | {t.wait_s:.2f} | "
                    f"{t.output_s:.2f} | {t.output_s / t.wall_s:.0%} |"
                )
            # Per rank, in windows' terms: as if no window ran twice (block rows' boundaries).
            per_rank[name] = km2 / (best[2].wall_s / 60) / 2 * row_overhead(block)
        print()
        print(
            "Output step: 1 rank = the COG from the tiled file; 2 ranks = rank 0's assembly "
            "(VRT over the parts, the same COG, removing the parts), after every part is in."
        )
        print()
        for name, (speedup, share) in limits.items():
            print(
                f"{name}: the machine's limit (2 unrelated processes started together, each "
                f"doing rank 1's share) is {speedup:.2f}x of 1 rank; 2 ranks reach {share:.0%} "
                "of it"
            )
        print()
        state(per_rank, assembly_mpx_s(work, 4096 if args.quick else 8192))


@dataclass(frozen=True)
class Timing:
    wall_s: float  # until rank 0 returned (the job's end)
    cpu_s: float  # of all ranks together
    wait_s: float  # rank 0, for the other ranks' parts
    output_s: float  # rank 0: the COG (1 rank) or the assembly (n ranks)


def row_overhead(block_px: int, chip: int = CHIP) -> float:
    """Windows run per window owned with `block_px` blocks: those between two block rows run
    once for each (the runner's rule), counted on a tall column of the default layout."""
    layout = WindowLayout.over(block_px * 64, chip, size=chip, overlap=chip // 4)
    runs = sum(
        len(layout.rows_touching(row0, row0 + block_px))
        for row0 in range(0, layout.height, block_px)
    )
    return runs / len(layout.row_starts)


def _run(config: PredictConfig, ranks: int) -> Timing:
    """Timings of a job of `ranks` ranks."""
    return _run_jobs([(config, rank, ranks) for rank in range(ranks)])


def _run_jobs(jobs: list[tuple[PredictConfig, int, int]]) -> Timing:
    """Start one rank per (config, rank, world size), all released together; the timings of
    the one that ends last (rank 0, in a job of ranks), CPU of them all."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    children = []
    for config, rank, world in jobs:
        values = {k: v for k, v in asdict(config).items() if k not in ("region", "storage_options")}
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", _RANK, json.dumps(values), str(rank), str(world)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=3600)
        if child.returncode != 0:
            raise SystemExit(f"rank failed with exit code {child.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    main_rank = max(reports, key=lambda r: float(r["seconds"]))
    return Timing(
        wall_s=float(main_rank["seconds"]),
        cpu_s=sum(float(r["cpu_s"]) for r in reports),
        wait_s=float(main_rank["wait_s"]),
        output_s=float(main_rank["output_s"]),
    )


def assembly_mpx_s(work: Path, side: int) -> float:
    """Megapixels per second of rank 0's assembly (VRT over two parts, the COG with mode
    overviews, removing the parts) of a side x side class map in patches like land cover's."""
    origin = Affine(1.0, 0.0, 500_000.0, 0.0, -1.0, 4_000_000.0)
    grid = OutputGrid(CRS.from_epsg(26918), origin, side, side)
    meta = ModelMeta("small_unet", CLASS_MAP, ("red", "green", "blue", "nir"), (110.0,) * 4,
                     (60.0,) * 4, chip_size=CHIP, resolution_m=1.0)  # fmt: skip
    staging = Staging(str(work / "assembly.tif"))
    rng = np.random.default_rng(3)
    records = []
    for share in (RankShare(0, 0, side // 2), RankShare(1, side // 2, side)):
        with PartWriter(staging, share, 2, "bench", probabilities=False) as part:
            rows = share.grid(grid)
            with rasterio.open(part.tiles_out, "w", **class_profile(rows)) as dst:
                describe_class_raster(dst, meta)
                for row0 in range(0, rows.height, 512):
                    patches = rng.integers(1, CLASS_MAP.num_classes, (32, side // 16 + 1))
                    block = np.repeat(np.repeat(patches, 16, 0), 16, 1)[:, :side]
                    height = min(512, rows.height - row0)
                    dst.write(
                        block[:height].astype(np.uint8), 1, window=Window(0, row0, side, height)
                    )
            records.append(part.commit(0, np.zeros(CLASS_MAP.num_classes, dtype=np.int64)))
    started = time.perf_counter()
    with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"):
        assemble(staging, records, grid, OutputPaths(str(work / "assembly.tif")))
    return side * side / 1e6 / (time.perf_counter() - started)


def state(per_rank_km2_min: dict[str, float], assembly_rate_mpx_s: float) -> None:
    """The wall time for a state from the per-rank rates and the library's row split."""
    total_km2 = STATE_FILES * FILE_KM2
    print(
        f"## Estimate: a state ({STATE_FILES:,} quarter-quads x {FILE_KM2:g} km² = "
        f"{total_km2:,.0f} km² at 1 m), {RANKS_PER_NODE} ranks per node"
    )
    print()
    print(
        "CPU rates measured above with 2 ranks (one torch thread per rank, so a 16-core node "
        "runs 16 ranks), carried to each block size by its windows run twice. The region is a "
        "Virginia-like shape of that area (wide south, narrow north); its block rows are "
        "split by `landcover.prediction.ranks.split_rows`, and the time is that of the rank "
        "with the most work. Assembly (one COG on rank 0) not included."
    )
    print()
    print(
        "| model | nodes | ranks | block px | windows run per window | block rows with work "
        "| busiest rank km² | hours |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rate in per_rank_km2_min.items():
        for nodes in (16, 64):
            for block in (2048, 512, 256):
                ranks = nodes * RANKS_PER_NODE
                busiest, rows = _busiest_share_km2(total_km2, block, ranks)
                overhead = row_overhead(block)
                print(
                    f"| {name} | {nodes} | {ranks} | {block} | {overhead:.2f} | {rows} | "
                    f"{busiest:,.0f} | {busiest * overhead / rate / 60:.1f} |"
                )
    print()
    assembly_h = total_km2 * 1e6 / (assembly_rate_mpx_s * 1e6) / 3600
    print(
        f"Assembly on rank 0 after the last part (serial, this machine's {os.cpu_count()} cores "
        f"through GDAL_NUM_THREADS): {assembly_rate_mpx_s:.0f} Mpx/s measured on a 2-part "
        f"class map, so about {assembly_h:.1f} h for the state's {total_km2 * 1e6:.2g} px "
        "(rows outside the region are sparse and cost little); add it to the hours above."
    )
    print()
    print(
        "A rank runs whole block rows (that keeps the COG identical to one process), so "
        "ranks beyond the block rows with work idle: with many ranks a smaller --block-px "
        "wins although more windows run twice (or fewer, faster ranks: GPUs)."
    )


def _busiest_share_km2(total_km2: float, block_px: int, ranks: int) -> tuple[float, int]:
    """(km² of the busiest rank's rows, block rows with work) for a state-shaped region."""
    # Wide in the south, a narrow tip in the north (km); scaled to the state's area. At 1 m
    # a state is ~10^11 px: the grid is only arithmetic here (row_costs reads no image).
    outline = shapely.Polygon([(0, 0), (800, 0), (760, 120), (420, 330), (200, 250), (60, 90)])
    scale = (total_km2 / outline.area) ** 0.5 * 1000.0  # km of the outline -> metres
    shape = shapely.affinity.scale(outline, scale, scale, origin=(0, 0))
    minx, miny, maxx, maxy = shape.bounds
    grid = OutputGrid(
        CRS.from_epsg(26918),
        Affine(1.0, 0.0, minx, 0.0, -1.0, maxy),
        width=int(maxx - minx) + 1,
        height=int(maxy - miny) + 1,
    )
    plan = GridPlan(grid, (), (), shape, shape)
    costs = row_costs(plan, block_px)
    shares = split_rows(plan, block_px, ranks)
    busiest = max(sum(costs[s.row0 // block_px : -(-s.row1 // block_px)]) for s in shares)
    return busiest / 1e6, sum(1 for c in costs if c > 0)


def _machine() -> str:
    return (
        f"{cpu_model_name()}, {os.cpu_count()} cores, torch {torch.__version__}, load average "
        f"{load_average():.1f} at start (a shared machine)"
    )


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_predict_ranks.py"):
        main()
