"""`landcover export`: a model file as ONNX or TorchScript, its metadata inside."""

from __future__ import annotations

import logging
from typing import Any

import click
from click.core import ParameterSource

from landcover.errors import ExportError

# Imports torch: paid only when `landcover export` runs (the group loads commands lazily).
from landcover.models.export import DEFAULT_OPSET, EXPORT_FORMATS, export_model
from landcover.options import output_url_callback, overwrite_option, storage_options_option

logger = logging.getLogger(__name__)


@click.command("export")
@click.argument("model")
@click.option(
    "--format",
    "export_format",
    type=click.Choice(EXPORT_FORMATS),
    required=True,
    help="onnx (onnxruntime, TensorRT, ...) or torchscript (LibTorch).",
)
@click.option(
    "--out",
    required=True,
    callback=output_url_callback(),
    help="Output file, e.g. model.onnx (local path).",
)
@click.option(
    "--opset",
    type=int,
    default=DEFAULT_OPSET,
    show_default=True,
    help="ONNX opset of the file, from 18 (the exporter's own) to the newest the installed "
    "onnx knows; above 18 the graph is converted up. --format onnx only.",
)
@overwrite_option
@storage_options_option
@click.pass_context
def export_command(
    ctx: click.Context,
    model: str,
    export_format: str,
    out: str,
    opset: int,
    overwrite: bool,
    storage_options: dict[str, Any],
) -> None:
    """Export MODEL (a model.pt) for other runtimes; batch, height and width stay dynamic."""
    if export_format != "onnx" and ctx.get_parameter_source("opset") is ParameterSource.COMMANDLINE:
        raise ExportError(
            f"--opset {opset} applies to --format onnx only; drop it for --format {export_format}"
        )
    result = export_model(
        model,
        out,
        format=export_format,
        opset=opset,
        overwrite=overwrite,
        storage_options=storage_options,
    )
    opset_text = f", opset {result.opset}" if result.opset is not None else ""
    click.echo(
        f"wrote {result.out}: {result.meta.architecture} as {result.format}{opset_text}, "
        f"{result.meta.num_classes} classes, {result.meta.chip_size} px chips "
        "(dynamic batch, height, width)"
    )
