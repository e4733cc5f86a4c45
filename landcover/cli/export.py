"""`landcover export`: a model file as ONNX or TorchScript, its metadata inside; the options
come from `landcover.models.export.ExportConfig`."""

from __future__ import annotations

import logging
from typing import Any

import click
from click.core import ParameterSource

from landcover.cliconfig import config_option, option_specs
from landcover.errors import ExportError

# Imports torch: paid only when `landcover export` runs (the group loads commands lazily).
from landcover.models.export import ExportConfig, export
from landcover.options import output_url_callback, overwrite_option

logger = logging.getLogger(__name__)


# The fields of `ExportConfig` that are options of `landcover export`, by name.
OPTIONS = {o.name: o for o in option_specs(ExportConfig)}


@click.command("export")
@config_option(OPTIONS["model"])
@config_option(OPTIONS["format"])
@config_option(OPTIONS["out"], callback=output_url_callback())
@config_option(OPTIONS["opset"])
@overwrite_option
@config_option(OPTIONS["storage_options"])
@click.pass_context
def export_command(ctx: click.Context, /, **options: Any) -> None:
    """Export MODEL (a model.pt) for other runtimes; batch, height and width stay dynamic."""
    config = ExportConfig(**options)
    given_opset = ctx.get_parameter_source("opset") is ParameterSource.COMMANDLINE
    if config.format != "onnx" and given_opset:
        raise ExportError(
            f"--opset {config.opset} applies to --format onnx only; drop it for --format "
            f"{config.format}"
        )
    result = export(config)
    opset_text = f", opset {result.opset}" if result.opset is not None else ""
    click.echo(
        f"wrote {result.out}: {result.meta.architecture} as {result.format}{opset_text}, "
        f"{result.meta.num_classes} classes, {result.meta.chip_size} px chips "
        "(dynamic batch, height, width)"
    )
