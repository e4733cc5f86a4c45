"""`landcover predict`: a thin wrapper that builds the prediction's config.

`predict --nproc N` runs the command as N local ranks, and an engine runs it as a job's ranks
(`landcover cluster launch cluster.json -- predict ...`, landcover.cli.stagejob): each rank
predicts its block rows, rank 0 writes the COG and alone prints the summary. With
`--out DIR/ --tile-size PX` each rank writes its own tiles of a tiled map product
(landcover.prediction.tiled).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from landcover.cli.stacinputs import StacInputArgs, stac_input_options
from landcover.cli.stagejob import enter_rank, launch_local_ranks, report, stage_options
from landcover.cli.stagetasks import unit_runner
from landcover.cliconfig import config_option
from landcover.errors import OutputError, PredictionError, RegionError
from landcover.options import output_url_callback, overwrite_option, storage_options_option
from landcover.outputlock import exclusive_outputs
from landcover.outputs import check_output_format, require_distinct
from landcover.prediction.config import PREDICT_OPTIONS as OPTIONS
from landcover.prediction.config import PredictConfig
from tiling.shared.rankenv import DistEnv

if TYPE_CHECKING:
    from landcover.prediction.outgrid import OutputGrid
    from tiling.stacquery import StacSource
    from tiling.units import UnitRunner

logger = logging.getLogger(__name__)


@click.command("predict")
@click.argument("model")
@click.argument("images", nargs=-1)
@stac_input_options(search_bbox=False)
@config_option(OPTIONS["out"], callback=output_url_callback(remote=True))
@click.option(
    "--region",
    default=None,
    help="GeoJSON file (Feature, FeatureCollection or geometry) or WKT polygon. "
    "Default: the union of the images.",
)
@click.option("--bbox", default=None, help="Region as W,S,E,N in --region-crs.")
@click.option(
    "--region-crs",
    default=None,
    help="CRS of --region / --bbox coordinates [default: EPSG:4326, or the GeoJSON's crs].",
)
@config_option(OPTIONS["dst_crs"])
@config_option(OPTIONS["resolution"])
@config_option(OPTIONS["max_pixels"], type=click.IntRange(min=1))
@config_option(OPTIONS["overlap_px"])
@config_option(OPTIONS["batch_size"])
@config_option(OPTIONS["device"], default="auto")  # the library's default is cpu
@config_option(OPTIONS["backend"])
@config_option(OPTIONS["precision"])
@config_option(OPTIONS["tta"], is_flag=False, flag_value="d4")
@config_option(OPTIONS["probabilities"], callback=output_url_callback(remote=True))
@click.option(
    "--stac-item",
    default=None,
    callback=output_url_callback(),
    metavar="PATH",
    help="Also write a STAC item describing the COG here (e.g. lc.json): footprint, dates of "
    "the input items, projection, raster band and classification:classes.",
)
@config_option(OPTIONS["block_px"])
@click.option(
    "--tile-size",
    "tile_px",
    type=int,
    default=None,
    metavar="PX",
    help="With --out DIR/ (a trailing slash or a directory): write a tiled map product, one "
    "COG per PX x PX tile (named E{x}_N{y} by its upper-left map corner), a STAC "
    "collection.json and mosaic.vrt; a rerun redoes only missing or changed tiles.",
)
@config_option(OPTIONS["zero_is_nodata"])
@click.option(
    "--quicklook/--no-quicklook",
    default=True,
    show_default=True,
    help="Also write a small PNG of the map with a legend beside it: <out>.quicklook.png "
    "(DIR/quicklook.png for a tiled product; local outputs only).",
)
@overwrite_option
@storage_options_option
@stage_options
@click.pass_context
def predict_command(
    ctx: click.Context,
    /,
    images: tuple[str, ...],
    stac_inputs: StacInputArgs,
    region: str | None,
    bbox: str | None,
    region_crs: str | None,
    stac_item: str | None,
    tile_px: int | None,
    quicklook: bool,
    nproc: int,
    rank_from_env: bool,
    summary_to: str | None,
    **options: Any,
) -> None:
    """Predict a land-cover map of a region from MODEL and IMAGES (paths, globs, az:// URLs,
    STAC JSON files).

    A STAC ItemCollection, item, catalog.json or collection.json gives the --stac-asset of one
    item per place; --stac-api searches the --region / --bbox. Hrefs are opened as they are
    (signing them, where a host needs it, is up to you).
    """
    if region is not None and bbox is not None:
        raise RegionError("give either --region or --bbox, not both")
    if region_crs is not None and region is None and bbox is None:
        raise RegionError(
            f"--region-crs {region_crs} applies to --region or --bbox coordinates; give one of "
            "them or drop --region-crs (the default region is the union of the images)"
        )
    if stac_inputs.api is not None and region is None and bbox is None:
        raise RegionError(
            f"--stac-api {stac_inputs.api}: give --region or --bbox, the area to search and map"
        )
    stac_inputs.check(images, area=True)
    check_distinct_outputs(ctx.params)
    if stac_item is not None:  # after the check that it is not the map itself
        check_output_format(
            stac_item, option="--stac-item", expected=(".json", ".geojson"), example="lc.json"
        )
    # the library's options, checked once (before the ranks start or the model loads)
    given = PredictConfig(images=images, **options)
    out, overwrite = given.out, given.overwrite
    tiled = _check_tiled_output(out, tile_px, given.max_pixels, given.probabilities, stac_item)
    quicklook = _check_quicklook(out, quicklook, tiled=tiled, overwrite=overwrite)
    if nproc > 1:  # the ranks check the rest (outputs first, before the model loads)
        # A run writing them now is refused before the ranks start (rank 0 takes the lock);
        # an output that cannot be written at all is left to the ranks' own check.
        outputs = (out, given.probabilities)
        lock = exclusive_outputs(outputs, "predict", inside=tiled)  # a product holds its own
        with contextlib.suppress(OSError), lock:
            pass
        launch_local_ranks(ctx, "predict", nproc)  # rank 0 writes the STAC item too
        return
    from landcover.devices import rank_device
    from landcover.prediction.region import (
        DEFAULT_REGION_CRS,
        parse_bbox,
        parse_crs,
        parse_region,
    )
    from landcover.prediction.runner import predict_region
    from landcover.prediction.stacitem import check_stac_item_target, write_stac_item

    dist = enter_rank(ctx) if rank_from_env else DistEnv()
    parsed = None
    if region is not None:
        parsed = parse_region(region, crs=region_crs)
    elif bbox is not None:
        parsed = parse_bbox(bbox, crs=region_crs or DEFAULT_REGION_CRS)
    if stac_item is not None:  # fail before the work, not after it
        check_stac_item_target(stac_item, overwrite=overwrite)
    area = None if parsed is None else parsed.to_crs(parse_crs("EPSG:4326")).geometry
    inputs = stac_inputs.resolve(
        images,
        storage_options=given.storage_options,
        intersects=None if area is None else area.__geo_interface__,
    )
    check_distinct_outputs(ctx.params, images=inputs.paths)  # globs and STAC hrefs resolved
    device = given.device
    config = replace(
        given,
        images=inputs.paths,
        region=parsed,
        device=rank_device(device, dist.local_rank) if dist.is_distributed else device,
    )
    if tiled:
        runner = unit_runner(click.get_current_context())  # tiles as tasks on a Dask cluster
        _predict_tiled(config, tile_px, dist, summary_to, runner, inputs.stac_items)
        if quicklook and dist.is_main:  # the product's own picture: replaced on a rerun
            _write_quicklook(out, overwrite=True)
        return
    # SIGTERM: cli.main's handler lets cleanup run
    result = predict_region(
        config, rank=dist.rank, world_size=dist.world_size, local_ranks=dist.local_ranks
    )
    if not dist.is_main:
        return  # rank 0 speaks for the job
    grid, read = result.grid, len(result.sources)
    line = _summary_line(result.out, grid, result.valid_pixels, read, result.elapsed_s)
    report(summary_to, line)
    if result.probabilities:
        report(summary_to, f"wrote {result.probabilities}")
    if stac_item is not None:
        used = set(result.sources)
        sources = [s for s in inputs.stac_items if s.href in used]
        write_stac_item(stac_item, result.out, sources=sources, overwrite=overwrite)
        report(summary_to, f"wrote {stac_item}")
    if quicklook:
        _write_quicklook(result.out, overwrite=overwrite)


def _check_quicklook(out: str, quicklook: bool, *, tiled: bool, overwrite: bool) -> bool:
    """Whether to write the map's quicklook: asked for and the output local. Refuses, before
    any work, a file at the quicklook's path without --overwrite (a tiled product's own
    quicklook is replaced: a rerun resumes the product)."""
    from tiling.shared.urls import is_local

    if not quicklook or not is_local(out):
        return False
    from landcover.view.quicklook import quicklook_path

    if os.path.isdir(quicklook_path(out)):  # found now, not after the work
        raise OutputError(
            f"{quicklook_path(out)} is a directory where the quicklook goes; move it away or "
            "pass --no-quicklook"
        )
    if not tiled and not os.path.lexists(out):  # an existing map is refused by its own check
        from landcover.view.quicklook import check_quicklook_target

        check_quicklook_target(out, overwrite=overwrite)
    return True


def _write_quicklook(out: str, *, overwrite: bool) -> None:
    from landcover.view.quicklook import write_quicklook

    logger.info("wrote %s", write_quicklook(out, overwrite=overwrite))


def _check_tiled_output(
    out: str,
    tile_px: int | None,
    max_pixels: int | None,
    probabilities: str | None,
    stac_item: str | None,
) -> bool:
    """Whether `out` is a tiled product's directory; refuses --tile-size without one, and
    the options a tiled product has no use for."""
    from landcover.prediction.tileplan import tiled_output

    if tiled_output(out, tile_px, max_pixels) is None:
        return False
    for option, value, fix in (
        ("--probabilities", probabilities, "a tiled product holds class tiles only"),
        ("--stac-item", stac_item, "a tiled product writes its own collection.json"),
    ):
        if value is not None:
            raise PredictionError(f"{option} {value}: {fix}; drop {option}")
    return True


def _predict_tiled(
    config: PredictConfig,
    tile_px: int | None,
    dist: DistEnv,
    summary_to: str | None,
    runner: UnitRunner | None,
    stac_sources: Sequence[StacSource],
) -> None:
    """Predict a tiled product as this rank of the job, or with its tiles as tasks of
    `runner`; rank 0 prints the summary. `stac_sources`: the items the images came from."""
    from landcover.prediction.tiled import predict_product
    from landcover.prediction.tileplan import TiledSetup

    assert tile_px is not None  # _check_tiled_output
    result = predict_product(
        TiledSetup(config, tile_px, tuple(stac_sources)),
        rank=dist.rank,
        world_size=dist.world_size,
        run_units=runner,
    )
    if not dist.is_main:
        return
    report(
        summary_to,
        f"wrote {result.out}: {result.tiles} tile(s) of {tile_px} px ({result.tiles - result.kept} "
        f"predicted, {result.kept} kept) over {result.grid_width} x "
        f"{result.grid_height} px at {result.resolution:g}, {result.valid_pixels:,} px "
        f"predicted from {len(result.sources)} image(s) in {result.elapsed_s:.1f} s; "
        "collection.json, mosaic.vrt",
    )


def check_distinct_outputs(params: Mapping[str, Any], *, images: Sequence[str] = ()) -> None:
    """Refuse, before any work, two of the outputs of `predict` (its parsed `params`) at one
    file, or an output at the model or at one of `images` (default: IMAGES as given)."""
    outputs = [(f"--{name.replace('_', '-')}", params.get(name)) for name in _OUTPUT_PARAMS]
    sources = images or params.get("images") or ()
    inputs = [("model", str(params["model"])), *(("image", str(p)) for p in sources)]
    require_distinct(outputs, inputs=inputs)


_OUTPUT_PARAMS = ("out", "probabilities", "stac_item")


def _summary_line(
    out: str, grid: OutputGrid, valid_pixels: int, images: int, elapsed_s: float
) -> str:
    """The line `predict` ends with (one process or rank 0 of a job)."""
    epsg = grid.crs.to_epsg()
    crs_name = f"EPSG:{epsg}" if epsg else grid.crs.to_string()
    return (
        f"wrote {out}: {grid.width} x {grid.height} px at {grid.resolution:g} ({crs_name}), "
        f"{valid_pixels:,} px predicted from {images} image(s) in {elapsed_s:.1f} s"
    )
