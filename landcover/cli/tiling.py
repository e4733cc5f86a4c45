"""`landcover synth` and `landcover tile`: thin wrappers over `tiling` (info: cli/info.py).

`tile`'s options are generated from `tiling.tiler.config.TileConfig` (their defaults, help and
checks are its fields'), adding only what is the command's own (the output-URL callback, the
class-map choices). The command (and `cluster launch -- tile ...`, through `tile_stage`)
builds one `landcover.stageconfig.TileStage`, its images resolved once, and runs it with
`landcover.stagerun.run_stage`: in this process, or as `--nproc N` local ranks. The tiling
stack (rasterio, zarr, shapely, pystac) is imported by the stage's run, so that the ranks'
launcher imports no more of it than resolving the inputs needs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from landcover.cli.stacinputs import StacInputArgs, stac_input_options
from landcover.cli.stagejob import nproc_option, run_local_ranks
from landcover.cliconfig import config_option, option_specs
from landcover.options import LocalOutputPath, output_url_callback, overwrite_option
from landcover.outputs import check_can_create_in
from landcover.stageconfig import TileStage
from landcover.stagerun import InProcess, run_stage
from landcover.stagework import skipped_note
from tiling.sources.classes import available_class_maps
from tiling.tiler.config import TileConfig

if TYPE_CHECKING:
    from tiling.tiler.tile import TilePlan

DRY_RUN_WORLD_SIZES = (1, 2, 4, 8)

# The fields of `TileConfig` that are options of `landcover tile`, by name.
OPTIONS = {o.name: o for o in option_specs(TileConfig)}


def mb(n_bytes: int) -> str:
    if n_bytes >= 10**9:
        return f"{n_bytes / 1e9:.2f} GB"
    return f"{n_bytes / 1e6:.1f} MB"


@contextmanager
def _progress_bar(total: int) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr when it is a terminal, else nothing."""
    if not sys.stderr.isatty():
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
    from tiling.synthetic.scenes import SynthConfig, scene_folders, synthesize_scenes

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
@nproc_option
@click.pass_context
def tile_command(
    ctx: click.Context,
    /,
    images: tuple[str, ...],
    stac_inputs: StacInputArgs,
    dry_run: bool,
    nproc: int,
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
    stage = tile_stage(images=images, stac_inputs=stac_inputs, options=options)
    if dry_run:
        from tiling.tiler.planfile import plan_for_rank

        for line in describe_plan(plan_for_rank(stage.config, rank=0, world_size=1)):
            click.echo(line)
        return
    if nproc > 1:  # rank 0 plans (and warns), the others load its plan
        run_local_ranks(ctx, stage, nproc)  # rank 0's summary line is printed once
        return
    quiet = bool(ctx.obj and ctx.obj.get("quiet"))
    bar = None if quiet else _progress_bar
    run_stage(stage, InProcess(progress_bar=bar, say=click.echo))


def tile_stage(
    *, images: Sequence[str], stac_inputs: StacInputArgs, options: Mapping[str, Any]
) -> TileStage:
    """The stage of `landcover tile` with these parsed values (`options`: the `TileConfig`
    fields the command takes): the options checked once, then the images resolved (globs,
    STAC documents and any STAC search), once, here."""
    stac_inputs.check(images)
    values = {**options, "storage_options": dict(options["storage_options"])}
    given = TileConfig(images=tuple(images), **values)  # the options checked once
    inputs = stac_inputs.resolve(images, storage_options=given.storage_options)
    return TileStage(replace(given, images=tuple(inputs.paths)))


def describe_plan(plan: TilePlan) -> list[str]:
    """The --dry-run report."""
    p = plan.params
    labels = f"{len(p.labels)} label rasters ({p.class_map.name})" if p.class_map else "no labels"
    blocks, val_blocks = plan.num_blocks
    lines = [
        f"sources: {len(plan.sources)} images, {labels}{skipped_note(plan)}",
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
