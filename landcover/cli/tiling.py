"""`landcover synth` and `landcover tile`: thin wrappers over `tiling` (info: cli/info.py).

`tile`'s options are generated from `tiling.config.TileConfig` (their defaults, help and
checks are its fields'), adding only what is the command's own (the output-URL callback, the
class-map choices). The tiling stack (rasterio, zarr, shapely, pystac) is imported inside the
commands, so that `tile --nproc N` starts its ranks without importing it: the ranks import it
themselves.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from landcover.cli.stacinputs import StacInputArgs, stac_input_options
from landcover.cli.stagejob import (
    enter_rank,
    launch_local_ranks,
    only_rank_0_warns,
    report,
    stage_options,
)
from landcover.cli.stagetasks import unit_runner
from landcover.cliconfig import config_option, option_specs
from landcover.distenv import pooled_share
from landcover.options import LocalOutputPath, output_url_callback, overwrite_option
from landcover.outputs import check_can_create_in
from tiling.classes import available_class_maps
from tiling.config import TileConfig
from tiling.shared.rankenv import DistEnv

if TYPE_CHECKING:
    from tiling.store import StoreSummary
    from tiling.tile import TilePlan

DRY_RUN_WORLD_SIZES = (1, 2, 4, 8)

# The fields of `TileConfig` that are options of `landcover tile`, by name.
OPTIONS = {o.name: o for o in option_specs(TileConfig)}


def mb(n_bytes: int) -> str:
    if n_bytes >= 10**9:
        return f"{n_bytes / 1e9:.2f} GB"
    return f"{n_bytes / 1e6:.1f} MB"


@contextmanager
def _progress_bar(total: int, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr when it is a terminal, else nothing."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="chip", desc="tile", file=sys.stderr) as bar:
        yield bar.update


@click.command("synth")
@click.argument("out_dir", type=LocalOutputPath(file_okay=False, path_type=Path))
@click.option("--scenes", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--size",
    "size_px",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Scene width and height in pixels.",
)
@click.option("--seed", type=int, default=0, show_default=True)
def synth_command(out_dir: Path, scenes: int, size_px: int, seed: int) -> None:
    """Write synthetic NAIP-like scenes and Chesapeake labels to OUT_DIR."""
    from tiling.synth import SynthConfig, scene_folders, synthesize_scenes

    for folder in scene_folders(out_dir):  # before the world is built
        check_can_create_in(folder)
    result = synthesize_scenes(
        SynthConfig(out_dir=out_dir, scenes=scenes, size_px=size_px, seed=seed)
    )
    images = Path(result.image_paths[0]).parent if result.image_paths else out_dir
    labels = Path(result.label_paths[0]).parent if result.label_paths else out_dir
    click.echo(
        f"wrote {len(result.image_paths)} scenes of {size_px} x {size_px} px: "
        f"images in {images}, labels in {labels}"
    )
    click.echo(f"next: landcover tile '{images}/*.tif' --labels '{labels}' --out chips.zarr")


@click.command("tile")
@click.argument("images", nargs=-1)
@stac_input_options(search_bbox=True)
@config_option(OPTIONS["labels"])
@config_option(
    OPTIONS["out"],
    callback=output_url_callback(remote=True, formats=(".zarr",), example="chips.zarr"),
)
@config_option(OPTIONS["chip_size"])
@config_option(OPTIONS["stride"])
@config_option(OPTIONS["shard_size"])
@config_option(OPTIONS["min_valid"])
@config_option(OPTIONS["class_map"], type=click.Choice(available_class_maps()))
@config_option(OPTIONS["num_classes"])
@config_option(OPTIONS["val_fraction"])
# --no-zero-nodata alone: the flag turns the default off
@config_option(OPTIONS["zero_is_nodata"], flag_value=False, show_default=False)
@config_option(OPTIONS["workers"])
@config_option(OPTIONS["storage_options"])
@overwrite_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the inputs, print chips, bytes and RAM per worker; write nothing.",
)
@stage_options
@click.pass_context
def tile_command(
    ctx: click.Context,
    /,
    images: tuple[str, ...],
    stac_inputs: StacInputArgs,
    dry_run: bool,
    nproc: int,
    rank_from_env: bool,
    summary_to: str | None,
    **options: Any,
) -> None:
    """Cut IMAGES (paths, quoted globs, URLs or STAC JSON files) into a sharded Zarr v3 chip
    store at --out.

    A STAC ItemCollection, item, catalog.json or collection.json (or a --stac-api search)
    gives the --stac-asset of one item per place; hrefs are opened as they are (signing
    them, where a host needs it, is up to you). Rerunning the same command resumes an
    interrupted store; a complete store or one written with other options is refused unless
    --overwrite.
    """
    stac_inputs.check(images)
    if nproc > 1 and not dry_run:  # rank 0 plans (and warns), the others load its plan
        TileConfig(images=images, **options)  # bad options refused before the ranks start
        launch_local_ranks(ctx, "tile", nproc)  # rank 0's summary line is printed once
        return
    with _imports_kept_out_of_collections():
        from tiling.planfile import plan_for_rank
        from tiling.shared.machine import cores_per_rank
        from tiling.tile import tile

    dist = enter_rank(ctx) if rank_from_env else DistEnv()
    # the ranks on a node share its cores
    pooled = dist.is_distributed and options["workers"] is None
    if pooled:
        options["workers"] = cores_per_rank(dist.local_world_size)
    options["storage_options"] = dict(options["storage_options"])
    with only_rank_0_warns(dist):
        inputs = stac_inputs.resolve(images, storage_options=options["storage_options"])
        config = TileConfig(images=inputs.paths, **options)  # the options checked once
        plan = plan_for_rank(config, rank=dist.rank, world_size=dist.world_size)
    if pooled:  # ranks without sources leave their cores to those with some
        config = replace(config, workers=_pooled_workers(plan, dist, config.effective_workers))
    if dry_run:
        if dist.is_main:
            for line in describe_plan(plan):
                click.echo(line)
        return
    quiet = bool(ctx.obj and ctx.obj.get("quiet"))
    with _progress_bar(plan.max_chips, enabled=not quiet and dist.is_main) as progress:
        result = tile(
            config,
            plan=plan,
            progress=progress,
            rank=dist.rank,
            world_size=dist.world_size,
            run_units=unit_runner(ctx),  # sources as tasks on a Dask cluster
        )
    if not dist.is_main:
        return  # rank 0 speaks for the job
    ranks = f"{dist.world_size} ranks x " if dist.is_distributed else ""
    workers_text = f"{ranks}{result.workers} workers"
    summary = result.summary
    line = _summary_line(plan, summary, result.sources_resumed, result.elapsed_s, workers_text)
    report(summary_to, line)


@contextmanager
def _imports_kept_out_of_collections() -> Iterator[None]:
    """Import the tiling stack with the cyclic collector paused, then freeze what is alive.

    The modules live as long as the process: frozen, no later full collection (nor the one
    at exit) walks their objects again, and none runs while they are built; together about
    a fifth of the CPU the imports cost. Only when this call imports them (a process's
    first tile), so that a process running many commands freezes its objects once.
    """
    first = "tiling.tile" not in sys.modules
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if first:
            gc.freeze()
        if enabled:
            gc.enable()


def _pooled_workers(plan: TilePlan, dist: DistEnv, per_rank: int) -> int:
    """Reader threads for this rank when the ranks of its machine pool their cores: a rank
    that owns no source (more ranks than sources) leaves its share to those that do; rank 0
    always has work (it commits)."""
    from tiling.commit import source_owners

    owners = set(source_owners(plan, dist.world_size))
    busy = [r for r in dist.local_ranks if r == 0 or r in owners]
    return pooled_share(busy, dist.rank, dist.local_ranks, per_rank)


def _summary_line(
    plan: TilePlan, s: StoreSummary, resumed: int, elapsed_s: float, workers: str
) -> str:
    """The line `tile` ends with (one process or rank 0 of a job)."""
    resumed_note = f", {resumed} resumed" if resumed else ""
    return (
        f"wrote {plan.config.out}: {s.num_chips} chips (train {s.num_train}, val {s.num_val}) "
        f"from {len(s.sources)} sources{resumed_note}{_skipped_note(plan)} in {elapsed_s:.1f} s "
        f"with {workers}"
    )


def _skipped_note(plan: TilePlan) -> str:
    n = len(plan.skipped)
    if not n:
        return ""
    return f" ({n} image{'s' if n > 1 else ''} smaller than --chip-size skipped)"


def describe_plan(plan: TilePlan) -> list[str]:
    """The --dry-run report."""
    p = plan.params
    labels = f"{len(p.labels)} label rasters ({p.class_map.name})" if p.class_map else "no labels"
    blocks, val_blocks = plan.num_blocks
    lines = [
        f"sources: {len(plan.sources)} images, {labels}{_skipped_note(plan)}",
        f"chips: up to {plan.max_chips} (train {plan.max_train}, val {plan.max_val}) of "
        f"{p.chip_size} px, stride {p.stride}, {p.shard_size} per shard; --min-valid "
        f"{p.min_valid} drops some",
        f"split: {val_blocks} of {blocks} ground blocks of {plan.split.edge_m:g} m "
        f"({plan.split.crs}) are val",
        f"bytes: up to {mb(plan.raw_bytes)} uncompressed (images + labels), "
        f"{plan.chip_bytes} bytes per chip",
        "RAM per training worker (train split in memory):",
    ]
    for n in DRY_RUN_WORLD_SIZES:
        lines.append(f"  {n} worker{'s' if n > 1 else ' '}: {mb(plan.ram_per_worker_bytes(n))}")
    return lines
