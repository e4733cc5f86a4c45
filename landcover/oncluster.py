"""The Python API's `cluster=`: a stage run on the engine of a cluster.json, or on a task
engine's cluster through a client object the caller holds (a notebook's `distributed.Client`).

`train_on_cluster` launches the training job and waits for it (the same job
`landcover cluster launch` runs), then reads the `TrainResult` back from the run dir's last
checkpoint. `tasks_on` is the `Tasks` executor that `landcover.stagerun.run_stage` (the one
runner the command uses) runs a tile or predict stage with: a tile's sources and a tiled
product's tiles as tasks of the task engine, this process committing; a one-COG prediction
as one rank per worker. The task engine comes from the engine registry (`cluster.tasks`): no
engine is imported or named here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.clusterjson import load_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job
from cluster.engines import engine_info
from cluster.spec import ClusterSpec
from cluster.tasks import task_engine, task_engine_names, task_engine_of_client
from landcover.errors import LandcoverError

if TYPE_CHECKING:
    from landcover.stagerun import Tasks
    from landcover.training.config import TrainConfig
    from landcover.training.trainer import TrainResult

ClusterArg = str | os.PathLike[str] | Any  # a cluster.json path or a distributed.Client


def cluster_of(cluster: ClusterArg) -> tuple[ClusterSpec, Any]:
    """The spec of `cluster`, and the client object when one was given (a task engine's own
    kind of client, which that engine reads as a spec: for Dask, its workers grouped by host,
    one node per host, the fewest workers on a host per node)."""
    if isinstance(cluster, str | os.PathLike):
        return load_cluster_spec(os.fspath(cluster)), None
    found = task_engine_of_client(cluster)
    if found is None:
        raise LandcoverError(
            f"cluster= takes a cluster.json path or a distributed.Client, got "
            f"{type(cluster).__name__}"
        )
    return found[1], cluster


def train_on_cluster(config: TrainConfig, cluster: ClusterArg) -> TrainResult:
    """Train `config` on `cluster` and return the result read back from the run dir."""
    from landcover.training.launch import check_run_dir, overwrite_once, training_job

    spec, client = cluster_of(cluster)
    check_run_dir(spec, config)
    job = training_job(spec, config)
    if client is not None:  # ranks on the caller's own cluster
        plan = task_engine(spec).plan(spec, job, client=client)
    else:
        plan = plan_job(spec, job)
    overwrite_once(spec, config)
    launch_plan(plan, LaunchOptions(wait=True))
    return read_train_result(Path(config.out_dir))


def read_train_result(run_dir: Path) -> TrainResult:
    """The `TrainResult` of the finished run in `run_dir` (from its last checkpoint)."""
    from landcover.training.checkpoint import read_checkpoint
    from landcover.training.records import Checkpoint
    from landcover.training.trainer import TrainResult

    path = run_dir / "checkpoints" / "last.pt"
    if not path.is_file():
        raise LandcoverError(f"{run_dir}: no checkpoint after the job; see the logs in {run_dir}")
    checkpoint = Checkpoint.from_payload(read_checkpoint(path, must_match={}))
    records = checkpoint.records
    return TrainResult(
        run_dir=run_dir,
        epochs_completed=len(records),
        best_epoch=checkpoint.best_epoch,
        best_val_miou=checkpoint.best_val_miou,
        stopped_early=checkpoint.stopped_early,
        metrics=tuple(records),
    )


def tasks_on(cluster: ClusterArg, stage: str) -> Tasks:
    """The `Tasks` executor of `cluster`'s task engine for `stage` (its name, for the one
    line when the engine runs no tasks); made before the stage's inputs are resolved, so a
    closed client or a rank engine is said first."""
    from landcover.stagerun import Tasks

    spec, client = cluster_of(cluster)
    if not engine_info(spec.engine).runs_tasks:
        raise LandcoverError(
            f'landcover.{stage}(cluster=...) runs on a task engine: engine "{spec.engine}" '
            f"runs no tasks; use engine {task_engine_names()}, or `landcover cluster launch` "
            "for ranks"
        )
    return Tasks(spec, client=client)
