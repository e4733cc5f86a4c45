"""`tile` and `predict` as N ranks: `--nproc N` on this machine, or any engine through
`landcover cluster launch cluster.json -- tile|predict ARGS`.

The command builds its stage (`landcover.stageconfig`: every option, the inputs resolved
once, here) and runs it with `landcover.stagerun.run_stage`: `--nproc N` as the ranks of the
local engine, which publish nothing but the stage itself in its staging area; every rank runs
`python -m landcover stage-rank URL` (`landcover.cli.stagerank`), never the user's command
line. Storage options never travel on a command line or in the stage file, where any user of
the machine could read them: the ranks get them in their environment
(`LANDCOVER_STORAGE_OPTIONS`).

A rank logs with its rank in every line (`enter_rank`); rank 0 speaks for the job (INFO), the
others report only problems. A rank that fails leaves its one-line error for the launcher
(`cluster.failures`), which reports the first one.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cluster.engine import LaunchOptions
from cluster.redact import collect_secret_values
from cluster.spec import local_spec
from landcover.cli.app import RANK_KEY, RANK_SECRETS_KEY
from landcover.distenv import read_dist_env
from landcover.stageconfig import Stage
from landcover.stagerun import Ranks, StageError, run_stage
from tiling.runtime.rankenv import DistEnv

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["StageError", "enter_rank", "logging_args_of", "nproc_option", "run_local_ranks"]


def nproc_option(f: F) -> F:
    """`--nproc N`: run the command as N local processes (ranks) that share the work."""
    return click.option(
        "--nproc",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Local processes (ranks) that share the work, each with its share of the cores; "
        "1 runs in this process. On a cluster: `landcover cluster launch cluster.json -- ...`.",
    )(f)


def logging_args_of(ctx: click.Context) -> list[str]:
    """`landcover -v/-q` as the user gave them, for the ranks to log the same way."""
    root = ctx.find_root().obj or {}
    return ["-v"] * int(root.get("verbose", 0)) + (["-q"] if root.get("quiet") else [])


def run_local_ranks(ctx: click.Context, stage: Stage, nproc: int) -> None:
    """Run `stage` as `nproc` ranks on this machine (the local engine sets each one's
    RANK/WORLD_SIZE), streaming their output to stderr, then print rank 0's summary lines on
    stdout. A failed rank ends it with that rank's one-line error: where the ranks refused
    their input, the very line one process gives."""
    logging_args = logging_args_of(ctx)
    quiet = "-q" in logging_args
    executor = Ranks(
        local_spec(nproc),
        LaunchOptions(on_output=None if quiet else _stderr, keep_logs=False),
        logging_args=tuple(logging_args),
        summary=True,
        as_one_process=True,
    )
    for line in run_stage(stage, executor).lines:
        click.echo(line)


def enter_rank(ctx: click.Context) -> DistEnv:
    """This process as one rank: read where it sits, log with the rank in every line (rank 0
    at the level asked, the others warnings only) and remember the rank, so that a failure is
    left for the launcher (`landcover.cli.app`)."""
    ctx.meta[RANK_SECRETS_KEY] = collect_secret_values(ctx.params.get("storage_options") or {})
    ctx.meta[RANK_KEY] = None  # a rank, though not yet known which
    env = read_dist_env()
    ctx.meta[RANK_KEY] = env.rank
    root = ctx.find_root().obj or {}
    verbose, quiet = int(root.get("verbose", 0)), bool(root.get("quiet"))
    level = logging.DEBUG if verbose > 1 else logging.INFO
    if quiet or not env.is_main:
        level = logging.WARNING
    _log_as_rank(ctx, env.rank, level)
    return env


def _log_as_rank(ctx: click.Context, rank: int, level: int) -> None:
    """Set the root logger's level, and the rank in the format of the stderr handler
    `landcover` installed, until the command ends (then restored: a command run in-process,
    as in tests, leaves the process's logging as it found it)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if type(h) is logging.StreamHandler]
    added = None
    if not ours:  # logging was set up by a host (a test runner): add stderr for this command
        added = logging.StreamHandler(sys.stderr)
        root.addHandler(added)
    saved = (root.level, [(h, h.formatter) for h in ours])
    formatter = logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")
    for handler in [*ours, *([added] if added else [])]:
        handler.setFormatter(formatter)
    root.setLevel(level)

    def restore() -> None:
        root.setLevel(saved[0])
        for handler, old in saved[1]:
            handler.setFormatter(old)
        if added is not None:
            root.removeHandler(added)

    ctx.call_on_close(restore)


def _stderr(line: str) -> None:
    click.echo(line, err=True)
