"""`run_stage(stage, executor)`: one runner for every stage, three ways to execute it.

- `InProcess`: this process runs the whole stage (or, given its place in a job, one rank's
  share of it: what every rank does once it has read the stage).
- `Ranks`: the ranks of an engine (the local engine for `--nproc N`, any engine of a
  cluster.json for `cluster launch`), started through `cluster.engine`. The stage is
  published once in its staging area (`landcover.stageconfig.publish_stage`) and every rank
  runs the one entry point `python -m landcover stage-rank URL` (`landcover.cli.stagerank`):
  it reads its place from the launcher's variables (`landcover.distenv.read_dist_env`), reads
  and verifies the stage, and runs it `InProcess` at that place. Storage options go to the
  ranks' environment only. The ranks coordinate through the output location alone.
- `Tasks`: the units of work (a source of `tile`, a tile of a tiled product) as tasks of a
  task engine, whose runner comes from the engine registry (`cluster.tasks.task_engine`), while
  this process commits; a one-COG `predict` there runs one rank per worker
  (`TaskEngine.run_ranks`), each rank a task given the stage object itself.

No engine is imported here, or anywhere in `landcover`: rank engines are reached through
`cluster.engine`, task engines through `cluster.tasks`, both by name from the registry.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.engine import Job, LaunchOptions, LaunchResult, Plan, launch_plan, plan_job
from cluster.engines import engine_info
from cluster.errors import LaunchError
from cluster.spec import ClusterSpec
from cluster.tasks import task_engine
from landcover.errors import LandcoverError
from landcover.options import storage_options_env
from landcover.stageconfig import PredictStage, Stage, publish_stage, remove_published, stage_url
from landcover.stagework import ProgressBar, StageOutcome, run_as_rank, run_here
from tiling.runtime.rankenv import DistEnv

RANK_MODULE = "landcover"  # every rank runs `python -m landcover stage-rank URL`
RANK_COMMAND = "stage-rank"
SUMMARY_FLAG = "--summary-to"


class StageError(LandcoverError):
    """A tile or predict job that cannot be run as asked."""


@dataclass(frozen=True)
class InProcess:
    """Run the stage in this process, as rank `dist` of its job (default: the only one).
    `progress_bar`: tile's bar over candidate chips (rank 0 only); `say`: each line the
    command ends with, as soon as it is known."""

    dist: DistEnv = field(default_factory=DistEnv)
    progress_bar: ProgressBar | None = None
    say: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Ranks:
    """Run the stage as the ranks of `spec`'s engine, launched with `options`.

    `logging_args`: `-v`/`-q` for every rank, as the user gave them. `summary`: rank 0
    writes the lines the command ends with to a file this process reads back (the outcome's
    lines), rather than its stdout. `as_one_process`: a rank's refusal of its input is raised
    as the one line one process gives (`StageError`), not as the job's failure. `on_plan`:
    shown the engine's plan before the launch."""

    spec: ClusterSpec
    options: LaunchOptions = field(default_factory=LaunchOptions)
    logging_args: tuple[str, ...] = ()
    summary: bool = False
    as_one_process: bool = False
    on_plan: Callable[[Plan], None] | None = None


@dataclass(frozen=True)
class Tasks:
    """Run the stage's units as tasks of `spec`'s task engine (on `client`, a client object
    of that engine's kind, when given), committing here."""

    spec: ClusterSpec
    client: Any = None


Executor = InProcess | Ranks | Tasks


@dataclass(frozen=True)
class RanksOutcome(StageOutcome):
    """A rank job's outcome: rank 0's lines (with `Ranks.summary`) and the launch's result."""

    launch: LaunchResult | None = None


def run_stage(stage: Stage, executor: Executor) -> StageOutcome:
    """Run `stage` with `executor` (see the module docstring)."""
    if isinstance(executor, InProcess):
        return run_here(
            stage, dist=executor.dist, progress_bar=executor.progress_bar, say=executor.say
        )
    if isinstance(executor, Tasks):
        return _run_tasks(stage, executor)
    return _run_ranks(stage, executor)


def rank_job(
    stage: Stage, *, logging_args: Sequence[str] = (), summary_to: str | None = None
) -> Job:
    """The job whose every worker runs `stage` as one rank: `python -m landcover [-v|-q]
    stage-rank URL`, URL where `publish_stage` puts it. It declares no inputs or outputs:
    the stage opens its paths and URLs itself (az:// included), so the engines pass them
    unchanged and keep their logs where they keep a job's without a run dir."""
    summary = (SUMMARY_FLAG, summary_to) if summary_to is not None else ()
    return Job(
        entry_module=RANK_MODULE,
        argv=(*logging_args, RANK_COMMAND, stage_url(stage), *summary),
        secret_env=storage_options_env(stage.config.storage_options),
        process_group=False,  # ranks coordinate through the output location alone
    )


def run_ranks(stage: Stage, executor: Ranks) -> RanksOutcome:
    """`run_stage(stage, executor)` with the launch's result in the outcome."""
    return _run_ranks(stage, executor)


def _run_ranks(stage: Stage, executor: Ranks) -> RanksOutcome:
    url = publish_stage(stage)
    options = stage.config.storage_options
    finished = True  # the job is over when this returns (not a submitted one)
    try:
        with tempfile.TemporaryDirectory(prefix="landcover-ranks-") as tmp:
            summary = Path(tmp) / "summary.txt" if executor.summary else None
            job = rank_job(
                stage,
                logging_args=executor.logging_args,
                summary_to=None if summary is None else str(summary),
            )
            plan = plan_job(executor.spec, job)
            if executor.on_plan is not None:
                executor.on_plan(plan)
            try:
                result = launch_plan(plan, executor.options)
            except LaunchError as exc:
                finished = engine_info(executor.spec.engine).runs_here
                cause = exc.worker_error
                if executor.as_one_process and cause is not None and cause.bad_input:
                    raise StageError(cause.message) from None  # said as one process says it
                raise
            finished = result.status != "submitted"
            lines: tuple[str, ...] = ()
            if summary is not None and summary.exists():
                lines = tuple(summary.read_text(encoding="utf-8").splitlines())
            return RanksOutcome(lines, None, result)
    finally:
        if finished:
            remove_published(url, storage_options=options)


def _run_tasks(stage: Stage, executor: Tasks) -> StageOutcome:
    engine = task_engine(executor.spec)
    if isinstance(stage, PredictStage) and not stage.runs_units:  # one COG: a rank per worker
        outcomes = engine.run_ranks(executor.spec, run_as_rank, stage, client=executor.client)
        first: StageOutcome = outcomes[0]
        return first
    with engine.runner(executor.spec, client=executor.client) as runner:
        return run_here(stage, run_units=runner)
