"""`landcover models`: the model names `--model` takes, with parameter counts, as text or
JSON; `--encoders` lists smp's encoder names instead."""

from __future__ import annotations

import json

import click


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option(
    "--encoders",
    is_flag=True,
    help="List every smp encoder name (for smp:ARCH:ENCODER), without parameter counts.",
)
def models_command(as_json: bool, encoders: bool) -> None:
    """List the models `landcover train --model` takes: the registered models, and smp's
    architectures on a curated set of encoders (smp:ARCH:ENCODER), with parameter counts at
    4 bands and the default classes. Any smp encoder fits in ENCODER: see --encoders.
    """
    from landcover.models.catalog import (
        TIMM_NOTE,
        catalog,
        default_num_classes,
        smp_encoders,
    )
    from landcover.models.smp_models import architectures

    if encoders:
        names = smp_encoders()
        if as_json:
            click.echo(json.dumps({"encoders": names, "timm": TIMM_NOTE}, indent=2))
            return
        for name in names:
            click.echo(name)
        click.echo(TIMM_NOTE)
        return
    entries = catalog()
    if as_json:
        payload = {
            "in_channels": 4,
            "num_classes": default_num_classes(),
            "models": [
                {"name": e.name, "kind": e.kind, "parameters": e.parameters} for e in entries
            ],
            "smp_architectures": architectures(),
        }
        click.echo(json.dumps(payload, indent=2))
        return
    width = max(len(e.name) for e in entries)
    click.echo(f"{'model':<{width}}  {'parameters':>12}")
    for entry in entries:
        click.echo(f"{entry.name:<{width}}  {entry.parameters:>12,}")
    click.echo(
        f"counts at 4 bands and {default_num_classes()} classes; smp:ARCH:ENCODER takes any "
        f"architecture ({', '.join(architectures())}) on any encoder of "
        "`landcover models --encoders`"
    )
