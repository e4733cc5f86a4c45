"""The end-to-end state-count run of `bench_state.py`: tile, then tiled predict, as ranks.

For a synthetic state mosaic of `n` small sources (`statemosaic`), every stage runs as `ranks`
processes started the way any engine starts them (`python -m landcover stage-rank URL`
with RANK / WORLD_SIZE in the environment), each rank's peak RSS read as its own (VmHWM). The
predict half is one function (`predict_tiled`), switched off with `--no-predict`. `estimate`
projects a state from the measured rates.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from rasterio.errors import NotGeoreferencedWarning
from statemosaic import build_state_mosaic

CHIP_PX = 64  # tile's chips: small sources still hold several
MODEL_CHIP_PX = 256  # the model's window
TILE_PX = 1024  # the tiled product's tiles
RANKS_PER_NODE = 16  # one rank per core of a 16-core node
QUARTER_QUAD_PX = 44_000_000  # ~176 gigapixels of Virginia at 1 m over ~4,000 quarter-quads
STATE_SOURCES = 4_000


@dataclass(frozen=True)
class StageRun:
    """One stage run as ranks: wall seconds, units done, pixels, each rank's peak RSS."""

    stage: str
    n_sources: int
    ranks: int
    wall_s: float
    units: int
    pixels: int
    rss_bytes: tuple[int, ...]
    error: str = ""

    @property
    def rank_s_per_unit(self) -> float:
        """Rank-seconds per unit (wall x ranks / units): what one unit costs one rank."""
        return self.wall_s * self.ranks / max(1, self.units)


def run_ranks(argv: list[str], ranks: int, workdir: Path) -> tuple[float, tuple[int, ...], str]:
    """`landcover ARGV` as `ranks` processes started as an engine starts them: the stage that
    line builds is published once (`landcover.stagerun`: its inputs resolved here, before the
    clock starts), then each process runs `python -m landcover stage-rank URL`; wall seconds,
    each rank's peak RSS (bytes) and the first failing rank's last stderr line ('' if none).

    The peak is the process's own VmHWM, read every 0.1 s while it runs (the rusage of a
    child would count the parent's memory at the fork: Linux carries it over)."""
    import click

    from landcover.cli.app import main
    from landcover.cli.cluster import cluster_stage
    from landcover.stageconfig import publish_stage

    stage = cluster_stage(click.Context(main, info_name="landcover", obj={}), argv)
    assert stage is not None, argv
    url = publish_stage(stage)
    procs = []
    start = time.perf_counter()
    for rank in range(ranks):
        env = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531",
            "LANDCOVER_ERROR_DIR": str(workdir),
        }  # fmt: skip
        err = (workdir / f"rank-{rank}.stderr").open("w")
        cmd = [sys.executable, "-m", "landcover", "-q", "stage-rank", url]
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
    peaks = [0] * ranks
    while any(proc.poll() is None for proc, _ in procs):
        for rank, (proc, _) in enumerate(procs):
            peaks[rank] = max(peaks[rank], _peak_rss(proc.pid))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    error = ""
    for rank, (proc, err) in enumerate(procs):
        err.close()
        if proc.returncode and not error:
            lines = (workdir / f"rank-{rank}.stderr").read_text().strip().splitlines()
            error = f"rank {rank} exit {proc.returncode}: {lines[-1] if lines else ''}"
    return wall, tuple(peaks), error


def _peak_rss(pid: int) -> int:
    """VmHWM of a running process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tile_stage(folder: Path, n: int, ranks: int) -> StageRun:
    """`landcover tile` of the mosaic under `folder` (labels in another CRS) as ranks."""
    out = folder / "chips.zarr"
    argv = ["tile", str(folder / "naip" / "*.vrt"), "--labels", str(folder / "labels"),
            "--out", str(out), "--chip-size", str(CHIP_PX), "--min-valid", "0",
            "--workers", "1"]  # fmt: skip
    wall, rss, error = run_ranks(argv, ranks, folder)
    return StageRun("tile", n, ranks, wall, n, n * _source_px(folder), rss, error)


def predict_tiled(folder: Path, n: int, ranks: int) -> StageRun:
    """`landcover predict --out DIR/ --tile-size` of the mosaic as ranks (a random small U-Net:
    the pixels' values do not matter here, their cost does)."""
    from landcover.models.modelfile import ModelMeta, save_model_file
    from landcover.models.registry import build_model
    from tiling.sources.classes import get_class_map

    class_map = get_class_map("chesapeake7to5")
    model = folder / "model.pt"
    meta = ModelMeta("small_unet", class_map, ("red", "green", "blue", "nir"), (110.0,) * 4,
                     (60.0,) * 4, chip_size=MODEL_CHIP_PX, resolution_m=1.0)  # fmt: skip
    save_model_file(model, build_model("small_unet", num_classes=class_map.num_classes), meta)
    out = folder / "map"
    argv = ["predict", str(model), str(folder / "naip" / "*.vrt"), "--out", f"{out}/",
            "--tile-size", str(TILE_PX), "--device", "cpu"]  # fmt: skip
    wall, rss, error = run_ranks(argv, ranks, folder)
    tiles = len(list(out.glob("E*_N*.tif"))) if out.is_dir() else 0
    return StageRun("predict", n, ranks, wall, tiles, n * _source_px(folder), rss, error)


def _source_px(folder: Path) -> int:
    import rasterio

    with rasterio.open(folder / "base-image.tif") as ds:
        return int(ds.width * ds.height)


def end_to_end(
    work: Path, n: int, ranks: int, *, size_px: int, predict: bool = True
) -> list[StageRun]:
    """Build the mosaic of `n` sources of `size_px`, tile it, then (if `predict`) map it."""
    folder = work / f"n{n}-{size_px}px"
    with warnings.catch_warnings():  # the one base file's own placement is never read
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        build_state_mosaic(folder, n, size_px=size_px)
    runs = [tile_stage(folder, n, ranks)]
    if predict:
        runs.append(predict_tiled(folder, n, ranks))
    return runs


def fit_unit_cost(small: StageRun, large: StageRun) -> tuple[float, float]:
    """(rank-seconds per unit, rank-seconds per pixel) solved from two runs whose units and
    pixels differ: rank-seconds = a x units + b x pixels (clamped at 0 under noise)."""
    t1, t2 = small.wall_s * small.ranks, large.wall_s * large.ranks
    u1, u2, p1, p2 = small.units, large.units, small.pixels, large.pixels
    det = u1 * p2 - u2 * p1
    if det == 0:
        return small.rank_s_per_unit, 0.0
    a = (t1 * p2 - t2 * p1) / det
    b = (u1 * t2 - u2 * t1) / det
    return max(0.0, a), max(0.0, b)


def estimate(
    tile_cost: tuple[float, float],
    predict_cost: tuple[float, float],
    plan_s_per_source: float,
    nodes: int,
) -> dict[str, float]:
    """Hours for a state of STATE_SOURCES quarter-quads on `nodes` nodes of RANKS_PER_NODE
    ranks: per-unit rate x units / ranks + fixed (rank 0's planning of every source)."""
    ranks = nodes * RANKS_PER_NODE
    state_px = STATE_SOURCES * QUARTER_QUAD_PX
    tiles = -(-state_px // (TILE_PX * TILE_PX))
    a_t, b_t = tile_cost
    a_p, b_p = predict_cost
    fixed_s = plan_s_per_source * STATE_SOURCES
    tile_s = (a_t + b_t * QUARTER_QUAD_PX) * STATE_SOURCES / ranks + fixed_s
    predict_s = (a_p * tiles + b_p * state_px) / ranks
    return {"tile_h": tile_s / 3600, "predict_h": predict_s / 3600, "tiles": float(tiles)}
