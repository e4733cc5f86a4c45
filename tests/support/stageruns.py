"""Stages run through the CLI and compared byte for byte with one process: the command lines
of `tile` and `predict` as ranks and the bytes compared. Their inputs and one-process results
are fixtures of tests/landcover/cli/conftest.py. Used by the rank, SLURM and Dask tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import rasterio
from click.testing import CliRunner, Result

from landcover.cli.app import main


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """`landcover ARGS...` in this process, under `env` where given."""
    return CliRunner(env=env).invoke(main, list(args))


def rank_args(*args: str) -> list[str]:
    """What an engine starts each rank of `landcover tile|predict ARGS` with (after
    `python -m landcover`): the stage that line builds, published as its launcher publishes
    it (`landcover.stagerun`)."""
    from landcover.cli.cluster import cluster_stage
    from landcover.stageconfig import publish_stage

    stage = cluster_stage(click.Context(main, info_name="landcover", obj={}), list(args))
    assert stage is not None
    return ["stage-rank", publish_stage(stage)]


def predict_at_rank_counts(
    args: list[str], tmp_path: Path, beside: Callable[[Path], list[str]] = lambda out: []
) -> dict[int, Path]:
    """`landcover predict ARGS --out tmp_path/ranks-N/lc.tif` (ARGS without --out, plus the
    options `beside(out)` gives for outputs beside it) in this process, as one process on 2
    threads and as 2 ranks on 1 thread each (rank 0 last: it waits for the others' parts); the
    outputs by rank count. Torch's threads are restored."""
    import torch

    runs: dict[int, Path] = {}
    before = torch.get_num_threads()
    try:
        for world_size, threads in ((1, 2), (2, 1)):
            torch.set_num_threads(threads)
            out = tmp_path / f"ranks-{world_size}" / "lc.tif"
            out.parent.mkdir()
            argv = [*args, "--out", str(out), *beside(out)]
            env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                   "LANDCOVER_ERROR_DIR": str(tmp_path / "errors")}  # fmt: skip
            for rank in [*range(1, world_size), 0]:
                ranked = rank_args(*argv) if world_size > 1 else argv
                result = run(*ranked, env={**env, "RANK": str(rank)})
                assert result.exit_code == 0, result.output
            runs[world_size] = out
    finally:
        torch.set_num_threads(before)
    return runs


# -- tile ---------------------------------------------------------------------------------------


def tile_args(images: Path, out: Path | str, *extra: str) -> list[str]:
    """`landcover tile` of `images` with NLCD labels into `out`, one worker."""
    return [
        "tile", str(images / "*.tif"), "--labels", str(images.parent / "nlcd"),
        "--class-map", "nlcd", "--out", str(out), "--chip-size", "64", "--shard-size", "3",
        "--min-valid", "0.3", "--val-fraction", "0.2", "--workers", "1", *extra,
    ]  # fmt: skip


# -- predict ------------------------------------------------------------------------------------


def predict_args(inputs: tuple[Path, Path, Path], out: Path, *extra: str) -> list[str]:
    """`landcover predict` of `inputs` into `out` with probabilities, 16 px blocks."""
    scene, model, region = inputs
    return [
        "predict", str(model), str(scene), "--out", str(out), "--region", str(region),
        "--probabilities", str(out.with_suffix(".p.tif")), "--block-px", "16",
        "--batch-size", "3", "--device", "cpu", *extra,
    ]  # fmt: skip


def cog_bytes(out: Path) -> tuple[bytes, bytes]:
    """The bytes of the map and of its probabilities beside it."""
    return out.read_bytes(), out.with_suffix(".p.tif").read_bytes()


def tile_pixels(folder: Path) -> dict[str, bytes]:
    """The pixels of every tile of a tiled map product, by file name."""
    pixels = {}
    for tif in sorted(folder.glob("E*_N*.tif")):
        with rasterio.open(tif) as ds:
            pixels[tif.name] = ds.read().tobytes()
    return pixels
