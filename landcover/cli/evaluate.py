"""`landcover evaluate`: a thin wrapper that scores a map against truth rasters
(landcover.evaluation) and writes the report."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import click

from landcover.errors import EvaluationError
from landcover.options import output_url_callback, overwrite_option, storage_options_option

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)


@click.command("evaluate")
@click.argument("prediction")
@click.option(
    "--truth",
    multiple=True,
    required=True,
    help="Truth raster(s): paths, globs or URLs; repeat the option for several.",
)
@click.option(
    "--class-map",
    default=None,
    help="Remap of the truth's raw codes [default: the prediction's class map].",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    callback=output_url_callback(),
    help="Write metrics.json, metrics.md and confusion.png here (a local directory).",
)
@click.option(
    "--panels/--no-panels",
    default=True,
    show_default=True,
    help="With --out: also a panel per scene (imagery | truth | prediction | disagreement) "
    "as panel-NN.png, the per-class table as classes.png, and report.html holding them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@overwrite_option
@storage_options_option
def evaluate_command(
    prediction: str,
    truth: tuple[str, ...],
    class_map: str | None,
    out_dir: str | None,
    panels: bool,
    as_json: bool,
    overwrite: bool,
    storage_options: dict[str, Any],
) -> None:
    """Score PREDICTION (a land-cover raster) against truth rasters."""
    from landcover.evaluation import (
        EvaluateConfig,
        check_report_target,
        evaluate_prediction,
        write_report,
    )
    from tiling.urls import check_storage_options

    if overwrite and out_dir is None:
        raise EvaluationError(
            "--overwrite replaces the report of --out DIR, and no --out was given; add "
            "--out DIR or drop --overwrite"
        )
    check_storage_options([prediction, *truth, *([out_dir] if out_dir else [])], storage_options)

    config = EvaluateConfig(
        prediction=prediction,
        truth=truth,
        class_map=class_map,
        storage_options=storage_options,
    )
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
