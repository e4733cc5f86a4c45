"""`landcover evaluate`: a thin wrapper that scores a map against truth rasters
(landcover.evaluation) and writes the report; the options the library reads come from
`landcover.evaluation.config.EvaluateConfig`."""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from landcover.cliconfig import config_option, option_specs
from landcover.errors import EvaluationError
from landcover.evaluation.config import EvaluateConfig
from landcover.options import out_url_option, overwrite_option

logger = logging.getLogger(__name__)


# The fields of `EvaluateConfig` that are options of `landcover evaluate`, by name.
OPTIONS = {o.name: o for o in option_specs(EvaluateConfig)}


@click.command("evaluate")
@config_option(OPTIONS["prediction"])
@config_option(OPTIONS["truth"])
@config_option(OPTIONS["reference"])
@config_option(OPTIONS["reference_raster"])
@config_option(OPTIONS["class_map"])
@out_url_option("Write metrics.json, metrics.md and confusion.png here (a local directory).")
@click.option(
    "--panels/--no-panels",
    default=True,
    show_default=True,
    help="With --out: also a panel per scene (imagery | truth | prediction | disagreement) "
    "as panel-NN.png, the per-class table as classes.png, and report.html holding them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@overwrite_option
@config_option(OPTIONS["storage_options"])
def evaluate_command(
    out_dir: str | None, panels: bool, as_json: bool, overwrite: bool, **options: Any
) -> None:
    """Score PREDICTION (a land-cover raster) against truth rasters, or estimate its class
    areas and accuracies from a labelled stratified sample (--reference)."""
    from landcover.evaluation import check_report_target, evaluate_prediction, write_report
    from tiling.runtime.urls import check_storage_options

    if overwrite and out_dir is None:
        raise EvaluationError(
            "--overwrite replaces the report of --out DIR, and no --out was given; add "
            "--out DIR or drop --overwrite"
        )
    if options.get("prediction"):
        options["prediction"] = _map_of(options["prediction"])
    config = EvaluateConfig(**options)
    if config.reference is not None:
        _evaluate_sample(config, out_dir, as_json=as_json, overwrite=overwrite)
        return
    urls = [config.prediction, *config.truth, *([out_dir] if out_dir else [])]
    check_storage_options(urls, config.storage_options)
    if out_dir is not None:  # fail before the work, not after it
        check_report_target(out_dir, overwrite=overwrite, pictures=panels)
    evaluation = evaluate_prediction(config)
    if out_dir is not None:
        scenes = None
        if panels:
            from landcover.evaluation.panels import scene_panels

            scenes = scene_panels(config, evaluation)
        for path in write_report(evaluation, out_dir, overwrite=overwrite, panels=scenes):
            logger.info("wrote %s", path)
    if as_json:
        click.echo(json.dumps(evaluation.to_json(), indent=2))
    else:
        click.echo(evaluation.to_markdown(), nl=False)


def _map_of(prediction: str) -> str:
    """PREDICTION as a raster: a tiled product's directory stands for its mosaic
    (DIR/mosaic.vrt); another directory is refused in one line saying what to give."""
    from tiling.runtime.urls import is_local, local_path

    if not is_local(prediction) or not local_path(prediction).is_dir():
        return prediction
    # the product's own name for it (its module is loaded only for a directory)
    from landcover.prediction.tilecatalog import MOSAIC
    from landcover.view.mapfile import product_mosaic

    mosaic = local_path(prediction) / MOSAIC
    if mosaic.is_file():
        return product_mosaic(prediction, mosaic)
    raise EvaluationError(
        f"{prediction}: a directory, not a land-cover raster; give the map (a GeoTIFF or a "
        f"VRT), or a tiled product's directory (one that holds {MOSAIC})"
    )


def _evaluate_sample(
    config: EvaluateConfig, out_dir: str | None, *, as_json: bool, overwrite: bool
) -> None:
    """`--reference`: area and accuracy estimates from a labelled sample."""
    from landcover.evaluation.areareport import (
        area_markdown,
        check_area_report_target,
        write_area_report,
    )
    from landcover.evaluation.samplecompare import evaluate_sample

    if out_dir is not None:  # fail before the work, not after it
        check_area_report_target(out_dir, overwrite=overwrite)
    evaluation = evaluate_sample(config)
    if out_dir is not None:
        for path in write_area_report(evaluation, out_dir, overwrite=overwrite):
            logger.info("wrote %s", path)
    if as_json:
        click.echo(json.dumps(evaluation.to_json(), indent=2))
    else:
        click.echo(area_markdown(evaluation), nl=False)
