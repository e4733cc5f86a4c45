"""`landcover stage-rank URL`: the one entry point of every rank of a tile or predict job.

An engine starts N processes with `python -m landcover [-v|-q] stage-rank URL`
(`landcover.stagerun.rank_job`); each reads its place in the job from the launcher's
variables (`landcover.distenv.read_dist_env`, through `enter_rank`), reads the stage its
launcher published at URL (`landcover.stageconfig.read_stage`, digest checked), with the
storage options from its environment ($LANDCOVER_STORAGE_OPTIONS), and runs its share
(`landcover.stagerun.InProcess`). It goes through the `landcover` group like any command, so
a rank's error is the one line one process prints, and is left for the launcher
(`cluster.failures`). Hidden: a user never types it.
"""

from __future__ import annotations

from typing import Any

import click

from landcover.cli.stagejob import enter_rank
from landcover.options import storage_options_option
from landcover.stagerun import SUMMARY_FLAG, InProcess, run_stage


@click.command("stage-rank", hidden=True)
@click.argument("stage_url")
@click.option(
    SUMMARY_FLAG,
    "summary_to",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the summary lines to FILE instead of stdout (for the --nproc parent).",
)
@storage_options_option
@click.pass_context
def stage_rank_command(
    ctx: click.Context, stage_url: str, summary_to: str | None, storage_options: Any
) -> None:
    """Run one rank of the stage published at STAGE_URL."""
    from landcover.stageconfig import read_stage

    dist = enter_rank(ctx)
    stage = read_stage(stage_url, storage_options=storage_options)
    run_stage(stage, InProcess(dist=dist, say=lambda line: _report(summary_to, line)))


def _report(summary_to: str | None, line: str) -> None:
    """Print one of the lines a stage ends with, or add it to the `--summary-to` file."""
    if summary_to is None:
        click.echo(line)
        return
    with open(summary_to, "a", encoding="utf-8") as file:
        file.write(line + "\n")
