"""`tile` and `predict` as N ranks: `--nproc N` on this machine, or any engine through
`landcover cluster launch cluster.json -- tile|predict ARGS`.

Every rank runs the very command the user gave, as `python -m landcover STAGE ARGS
--rank-from-env`. With that (hidden) flag the command reads its place in the job from the
launcher's environment (`landcover.distenv.read_dist_env`, the one reader of RANK/WORLD_SIZE
or SLURM's variables) and does its share; the ranks coordinate through the output location
alone (tiling's staged parts, prediction's parts), so any engine that starts N processes with
those variables runs a stage. Storage options never travel on a command line, where any user
of the machine could read them: they are taken out of the arguments and given to the ranks in
their environment (`LANDCOVER_STORAGE_OPTIONS`).

A rank logs with its rank in every line; rank 0 speaks for the job (INFO), the others report
only problems. A rank that fails leaves its one-line error for the launcher
(`cluster.failures`), which reports the first one.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from cluster.engine import Job, LaunchOptions, launch_job
from cluster.errors import LaunchError
from cluster.redact import collect_secret_values
from cluster.spec import local_spec
from landcover.cli.app import RANK_KEY, RANK_SECRETS_KEY, SUBCOMMAND_ARGS
from landcover.cliconfig import ALIASES_WARNED
from landcover.distenv import read_dist_env
from landcover.errors import LandcoverError
from landcover.options import storage_options_env
from tiling.shared.rankenv import DistEnv

F = TypeVar("F", bound=Callable[..., Any])

STAGES = ("tile", "predict")
STAGE_MODULE = "landcover"  # `python -m landcover STAGE ...`: the command itself
RANK_FLAG = "--rank-from-env"
SUMMARY_FLAG = "--summary-to"

# Options left out of a rank's arguments: --nproc (a rank is one process), the rank flag (added
# once, at the end) and the storage options (they go by environment). Name → takes a value.
_NOT_FOR_RANKS = {
    "--nproc": True,
    RANK_FLAG: False,
    SUMMARY_FLAG: True,
    "--storage-options": True,
}


class StageError(LandcoverError):
    """A tile or predict job that cannot be built as asked."""


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


def rank_option(f: F) -> F:
    """The hidden `--rank-from-env`: this process is one rank of a job an engine started.
    Eager, so that before the other options a rank knows that its launcher (the `--nproc`
    parent, `cluster launch`) parsed the user's line and warned about old spellings."""
    return click.option(
        RANK_FLAG,
        "rank_from_env",
        is_flag=True,
        hidden=True,
        is_eager=True,
        callback=_launcher_warned,
        help="Run as one rank of a job: read RANK/WORLD_SIZE (or SLURM's) from the environment.",
    )(f)


def _launcher_warned(ctx: click.Context, param: click.Parameter, rank: bool) -> bool:
    if rank:
        ctx.meta[ALIASES_WARNED] = True
    return rank


def summary_option(f: F) -> F:
    """The hidden `--summary-to FILE`: rank 0 writes the lines the command ends with to FILE
    (the `--nproc` parent prints them, once, on its stdout)."""
    return click.option(
        SUMMARY_FLAG,
        "summary_to",
        type=click.Path(dir_okay=False),
        default=None,
        hidden=True,
        help="Write the summary lines to FILE instead of stdout (for the --nproc parent).",
    )(f)


def stage_options(f: F) -> F:
    """What every stage takes to run as ranks: `--nproc`, and the hidden `--rank-from-env`
    and `--summary-to` (its function takes `nproc`, `rank_from_env` and `summary_to`)."""
    return nproc_option(rank_option(summary_option(f)))


def report(summary_to: str | None, line: str) -> None:
    """Print one of the lines a stage ends with, or add it to the `--summary-to` file."""
    if summary_to is None:
        click.echo(line)
        return
    with open(summary_to, "a", encoding="utf-8") as file:
        file.write(line + "\n")


def rank_argv(
    stage: str,
    args: Sequence[str],
    *,
    logging_args: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """What every rank runs after `python -m landcover`: the logging options, STAGE,
    --rank-from-env and `extra` options, then the user's arguments without --nproc and
    --storage-options (ours go first: after a `--` of the user's nothing is an option)."""
    if stage not in STAGES:
        raise StageError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    kept: list[str] = []
    tokens = iter(args)
    for token in tokens:
        if token == "--":  # everything after it is an argument, never an option
            kept.append(token)
            kept.extend(tokens)
            break
        name, eq, _ = token.partition("=")
        takes_value = _NOT_FOR_RANKS.get(name)
        if takes_value is None:
            kept.append(token)
        elif takes_value and not eq:
            next(tokens, None)  # drop the option's value too
    return [*logging_args, stage, RANK_FLAG, *extra, *kept]


def stage_job(
    stage: str,
    args: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    logging_args: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> Job:
    """The job whose every worker runs `landcover STAGE ARGS` as one rank (with `extra`
    options of ours). It declares no inputs or outputs: the stage opens its paths and URLs
    itself (az:// included), so the engines pass them unchanged, and keep their logs where
    they keep a job's without a run dir (a temporary directory locally, `slurm-logs/` on
    SLURM)."""
    return Job(
        entry_module=STAGE_MODULE,
        argv=tuple(rank_argv(stage, args, logging_args=logging_args, extra=extra)),
        secret_env=storage_options_env(storage_options or {}),
        process_group=False,  # ranks coordinate through the output location alone
    )


def logging_args_of(ctx: click.Context) -> list[str]:
    """`landcover -v/-q` as the user gave them, for the ranks to log the same way."""
    root = ctx.find_root().obj or {}
    return ["-v"] * int(root.get("verbose", 0)) + (["-q"] if root.get("quiet") else [])


def launch_local_ranks(ctx: click.Context, stage: str, nproc: int) -> None:
    """Run this very command as `nproc` ranks on this machine (the local engine sets each
    one's RANK/WORLD_SIZE), streaming their output to stderr, then print rank 0's summary
    lines on stdout. A failed rank ends it with that rank's one-line error: where the ranks
    refused their input (each checks it), the very line one process gives."""
    args = ctx.meta.get(SUBCOMMAND_ARGS)
    if args is None:
        raise StageError(
            f"--nproc {nproc}: the ranks rerun the command line, and there is none here; "
            f"run `landcover {stage} ... --nproc {nproc}` from the shell"
        )
    logging_args = logging_args_of(ctx)
    quiet = "-q" in logging_args
    with tempfile.TemporaryDirectory(prefix="landcover-ranks-") as tmp:
        summary = Path(tmp) / "summary.txt"
        job = stage_job(
            stage,
            args,
            storage_options=ctx.params.get("storage_options") or {},
            logging_args=logging_args,
            extra=[SUMMARY_FLAG, str(summary)],
        )
        try:
            options = LaunchOptions(on_output=None if quiet else _stderr, keep_logs=False)
            launch_job(local_spec(nproc), job, options)
        except LaunchError as exc:
            cause = exc.worker_error
            if cause is not None and cause.bad_input:  # said as one process says it
                raise StageError(cause.message) from None
            raise
        lines = summary.read_text(encoding="utf-8").splitlines() if summary.exists() else []
    for line in lines:
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


@contextmanager
def only_rank_0_warns(dist: DistEnv) -> Iterator[None]:
    """Run a stage's planning, in which every rank reads the same inputs and would warn alike,
    with the ranks other than 0 logging errors only: the job warns about its inputs once."""
    if dist.is_main:
        yield
        return
    root = logging.getLogger()
    saved = root.level
    root.setLevel(max(saved, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(saved)


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
