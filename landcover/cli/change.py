"""`landcover change`: the change between two maps of one region (landcover.change): a
change COG of from-to codes, the transition matrix in km² and each class's gains and
losses."""

from __future__ import annotations

import logging

import click

from landcover.options import out_url_option, overwrite_option

logger = logging.getLogger(__name__)


@click.command("change")
@click.argument("before", metavar="BEFORE")
@click.argument("after", metavar="AFTER")
@out_url_option("Directory for change.tif, change.json, change.md and change.png.", required=True)
@click.option(
    "--resample",
    is_flag=True,
    help="Warp AFTER onto BEFORE's grid (nearest neighbour) when their CRS or grids differ "
    "[default: refuse].",
)
@overwrite_option
def change_command(before: str, after: str, out_dir: str, resample: bool, overwrite: bool) -> None:
    """Change from BEFORE to AFTER (land-cover COGs, VRTs or tiled product directories of one
    class table): a change COG whose classes are the from-to pairs ("tree canopy→impervious"),
    the transition matrix in km² (JSON, Markdown, PNG) and each class's gains, losses and net
    change. `landcover view OUT` shows the change over both maps."""
    from landcover.change import ChangeConfig, run_change
    from landcover.outputs import require_distinct

    require_distinct([("--out", out_dir)], inputs=[("BEFORE", before), ("AFTER", after)])
    config = ChangeConfig(
        before=before, after=after, out_dir=out_dir, resample=resample, overwrite=overwrite
    )
    transitions = run_change(config)
    click.echo(transitions.to_markdown(title=f"Change in {out_dir}"), nl=False)
