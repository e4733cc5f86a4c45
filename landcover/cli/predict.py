"""`landcover predict`: a thin wrapper that builds the prediction's stage and runs it.

The command (and `cluster launch -- predict ...`, through `predict_stage`) builds one frozen
`landcover.stageconfig.PredictStage`: every option checked once where its config is built
(`PredictConfig`, `--tile-size` included), the inputs resolved (globs, STAC items, any STAC
search) and the region parsed once, here. `landcover.stagerun.run_stage` runs it in this
process, or as `--nproc N` local ranks (each predicts its block rows, rank 0 writes the COG and
alone prints the summary; with `--out DIR/ --tile-size PX` each rank writes its own tiles of a
tiled map product, landcover.prediction.tiled).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn

import click

from landcover.cli.stacinputs import StacInputArgs, stac_input_options
from landcover.cli.stagejob import nproc_option, run_local_ranks
from landcover.cliconfig import config_option
from landcover.errors import OutputError, PredictionError, RegionError
from landcover.options import output_url_callback, overwrite_option, storage_options_option
from landcover.outputlock import exclusive_outputs
from landcover.outputs import check_output_format, require_distinct
from landcover.prediction.config import PREDICT_OPTIONS as OPTIONS
from landcover.prediction.config import PredictConfig
from landcover.stageconfig import PredictStage, check_predict_outputs
from landcover.stagerun import InProcess, run_stage


class _AutoOrPx(click.ParamType):  # type: ignore[type-arg]
    """An option that takes auto (None: the library chooses) or px, at least `minimum` (None:
    any integer, the config checks it); anything else goes to `refuse`."""

    minimum: int | None = None

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return value
        if value == "auto":
            return None
        try:
            px = int(value)
        except ValueError:
            self.refuse(value, param, ctx)
        if self.minimum is not None and px < self.minimum:
            self.refuse(value, param, ctx)
        return px

    def refuse(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> NoReturn:
        raise NotImplementedError


class OverlapPx(_AutoOrPx):
    """`--overlap`: auto (None: `landcover.prediction.windows.choose_overlap_px`) or px."""

    name = "overlap"
    minimum = 0

    def refuse(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> NoReturn:
        self.fail(f"{value!r}: give auto or an overlap in px (0 or more)", param, ctx)


class BlockPx(_AutoOrPx):
    """`--block-px`: auto (None: `landcover.prediction.blocks.resolve_block_px`) or px; any
    other text is one line (`PredictionError`), as a too small edge is (`PredictConfig`)."""

    name = "block_px"

    def refuse(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> NoReturn:
        raise PredictionError(f"--block-px {value!r}: give auto or an edge in px")


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
@config_option(OPTIONS["overlap_px"], type=OverlapPx(), default="auto", metavar="auto|PX")
@config_option(OPTIONS["window"])
@config_option(OPTIONS["batch_size"])
@config_option(OPTIONS["device"], default="auto")  # the library's default is cpu
@config_option(OPTIONS["backend"])
@config_option(OPTIONS["precision"])
@config_option(OPTIONS["calibration"], metavar="STORE")
@config_option(OPTIONS["tta"], is_flag=False, flag_value="d4")
@config_option(OPTIONS["adapt"], metavar="METHOD[:STRENGTH]")
@config_option(OPTIONS["probabilities"], callback=output_url_callback(remote=True))
@click.option(
    "--stac-item",
    default=None,
    callback=output_url_callback(),
    metavar="PATH",
    help="Also write a STAC item describing the COG here (e.g. lc.json): footprint, dates of "
    "the input items, projection, raster band and classification:classes.",
)
@config_option(OPTIONS["block_px"], type=BlockPx(), default="auto", metavar="auto|PX")
@config_option(OPTIONS["tile_px"], type=int, metavar="PX")
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
@nproc_option
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
    quicklook: bool,
    nproc: int,
    **options: Any,
) -> None:
    """Predict a land-cover map of a region from MODEL and IMAGES (paths, globs, az:// URLs,
    STAC JSON files).

    A STAC ItemCollection, item, catalog.json or collection.json gives the --stac-asset of one
    item per place; --stac-api searches the --region / --bbox. Hrefs are opened as they are
    (signing them, where a host needs it, is up to you).
    """
    stage = predict_stage(
        images=images,
        stac_inputs=stac_inputs,
        region=region,
        bbox=bbox,
        region_crs=region_crs,
        stac_item=stac_item,
        quicklook=quicklook,
        options=options,
        ranks=nproc > 1,
    )
    if nproc > 1:
        run_local_ranks(ctx, stage, nproc)  # rank 0 writes the STAC item too
        return
    run_stage(stage, InProcess(say=click.echo))


def predict_stage(
    *,
    images: Sequence[str],
    stac_inputs: StacInputArgs,
    region: str | None,
    bbox: str | None,
    region_crs: str | None,
    stac_item: str | None,
    quicklook: bool,
    options: Mapping[str, Any],
    ranks: bool = False,
) -> PredictStage:
    """The stage of `landcover predict` with these parsed values (`options`: the
    `PredictConfig` fields the command takes), each checked once and before any work; the
    inputs resolved and the region parsed. `ranks`: it runs as several processes, so a run
    writing the outputs now is refused here, before they start."""
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
    model, out = options["model"], options["out"]
    outputs = {"out": out, "probabilities": options.get("probabilities"), "stac_item": stac_item}
    check_distinct_outputs(model, outputs, images)
    if stac_item is not None:  # after the check that it is not the map itself
        check_output_format(
            stac_item, option="--stac-item", expected=(".json", ".geojson"), example="lc.json"
        )
    # the library's options (--tile-size among them), checked once, before the model loads
    given = PredictConfig(images=tuple(images), **options)
    check_predict_outputs(given, stac_item)
    tiled = given.tile_px is not None
    quicklook = _check_quicklook(out, quicklook, tiled=tiled, overwrite=given.overwrite)
    if ranks:
        # A run writing them now is refused before the ranks start (rank 0 takes the lock);
        # an output that cannot be written at all is left to the ranks' own check.
        lock = exclusive_outputs((out, given.probabilities), "predict", inside=tiled)
        with contextlib.suppress(OSError), lock:
            pass
    from landcover.prediction.region import (
        DEFAULT_REGION_CRS,
        parse_bbox,
        parse_crs,
        parse_region,
    )

    parsed = None
    if region is not None:
        parsed = parse_region(region, crs=region_crs)
    elif bbox is not None:
        parsed = parse_bbox(bbox, crs=region_crs or DEFAULT_REGION_CRS)
    if stac_item is not None:  # fail before the work, not after it
        from landcover.prediction.stacitem import check_stac_item_target

        check_stac_item_target(stac_item, overwrite=given.overwrite)
    area = None if parsed is None else parsed.to_crs(parse_crs("EPSG:4326")).geometry
    inputs = stac_inputs.resolve(
        images,
        storage_options=given.storage_options,
        intersects=None if area is None else area.__geo_interface__,
    )
    check_distinct_outputs(model, outputs, inputs.paths)  # globs and STAC hrefs resolved
    config = replace(given, images=tuple(inputs.paths), region=parsed)
    return PredictStage(config, tuple(inputs.stac_items), stac_item, quicklook)


def _check_quicklook(out: str, quicklook: bool, *, tiled: bool, overwrite: bool) -> bool:
    """Whether to write the map's quicklook: asked for and the output local. Refuses, before
    any work, a file at the quicklook's path without --overwrite (a tiled product's own
    quicklook is replaced: a rerun resumes the product)."""
    from tiling.runtime.urls import is_local

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


def check_distinct_outputs(
    model: str, outputs: Mapping[str, str | None], images: Sequence[str]
) -> None:
    """Refuse, before any work, two of the outputs of `predict` (by parameter name: out,
    probabilities, stac_item) at one file, or an output at the model or at one of `images`."""
    named = [(f"--{name.replace('_', '-')}", value) for name, value in outputs.items()]
    inputs = [("model", str(model)), *(("image", str(p)) for p in images)]
    require_distinct(named, inputs=inputs)
