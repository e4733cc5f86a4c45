"""The Python API's `cluster=`: a stage run on the engine of a cluster.json, or on a Dask
cluster through a `distributed.Client` the caller holds (a notebook's).

`train_on_cluster` launches the training job and waits for it (the same job
`landcover cluster launch` runs), then reads the `TrainResult` back from the run dir's last
checkpoint. `tile_on_cluster` runs the tiling here with its sources as tasks on the Dask
cluster (`tiling.units`); `predict_on_cluster` runs one prediction rank per worker, and
`predict_tiles_on_cluster` one task per tile of a tiled product.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.clusterjson import load_cluster_spec, parse_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job
from cluster.engines import engine_info
from cluster.spec import ClusterSpec
from landcover.errors import LandcoverError

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig
    from landcover.prediction.runner import PredictResult
    from landcover.prediction.tiled import TiledResult
    from landcover.prediction.tileplan import TiledSetup
    from landcover.training.config import TrainConfig
    from landcover.training.trainer import TrainResult
    from tiling.tile import TileConfig, TileResult

ClusterArg = str | os.PathLike[str] | Any  # a cluster.json path or a distributed.Client


def cluster_of(cluster: ClusterArg) -> tuple[ClusterSpec, Any]:
    """The spec of `cluster`, and the `distributed.Client` when one was given (its workers
    grouped by host: one node per host, the fewest workers on a host per node)."""
    if isinstance(cluster, str | os.PathLike):
        return load_cluster_spec(os.fspath(cluster)), None
    if not hasattr(cluster, "scheduler") or not hasattr(cluster, "submit"):
        raise LandcoverError(
            f"cluster= takes a cluster.json path or a distributed.Client, got "
            f"{type(cluster).__name__}"
        )
    from cluster.dask.client import check_open, worker_hosts

    check_open(cluster)

    per_host = Counter(worker_hosts(cluster).values())
    if not per_host:
        raise LandcoverError("the Dask cluster has no workers: start some, then call again")
    spec = parse_cluster_spec(
        {
            "engine": "dask",
            "targetNodeCount": len(per_host),
            "processesPerNode": min(per_host.values()),
            "dask": {"scheduler": cluster.scheduler.address},
        },
        source="distributed.Client",
    )
    return spec, cluster


def train_on_cluster(config: TrainConfig, cluster: ClusterArg) -> TrainResult:
    """Train `config` on `cluster` and return the result read back from the run dir."""
    from cluster.dask.engine import plan_dask
    from landcover.training.launch import check_run_dir, overwrite_once, training_job

    spec, client = cluster_of(cluster)
    check_run_dir(spec, config)
    job = training_job(spec, config)
    plan = plan_dask(spec, job, client=client) if client is not None else plan_job(spec, job)
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


def tile_on_cluster(config: TileConfig, cluster: ClusterArg) -> TileResult:
    """Write the store of `config` here, its sources cut as tasks on the Dask cluster."""
    from cluster.dask.client import TaskRunner, dask_client
    from tiling.tile import tile

    spec, client = cluster_of(cluster)
    _need_tasks(spec)
    with dask_client(spec, client=client) as dask:
        return tile(config, run_units=TaskRunner(dask))


def predict_on_cluster(config: PredictConfig, cluster: ClusterArg) -> PredictResult:
    """Predict `config` as one rank per worker of the Dask cluster (each rank's share of the
    block rows is one task pinned to its worker; rank 0 assembles the output), and return
    rank 0's result."""
    from cluster.dask.client import dask_client, wait_for_tasks, worker_hosts
    from cluster.dask.engine import assign_ranks
    from cluster.dask.remote import run_capturing
    from landcover.prediction.runner import predict_region

    spec, client = cluster_of(cluster)
    _need_tasks(spec)
    embedded = client is None and spec.dask is not None and spec.dask.embedded
    with dask_client(spec, client=client, ranks=True) as connected:
        dask: Any = connected
        places = assign_ranks(
            worker_hosts(dask),
            nodes=spec.node_count,
            per_node=spec.processes_per_node,
            one_host=embedded,
        )
        world = len(places)
        futures = [
            dask.submit(
                run_capturing,
                predict_region,
                config,
                rank=p.rank,
                world_size=world,
                local_ranks=_local_ranks(p.rank, p.local_rank, p.local_world_size),
                workers=[p.worker],
                allow_other_workers=False,
                pure=False,
            )
            for p in places
        ]
        # a rank's error is raised here as it was raised there (cluster.dask.remote)
        results = wait_for_tasks(dask, futures, what="prediction ranks")
    result: PredictResult = results[0]
    return result


def predict_tiles_on_cluster(setup: TiledSetup, cluster: ClusterArg) -> TiledResult:
    """Predict the tiled product of `setup` with one task per tile on the Dask cluster; this
    process writes the collection and the mosaic."""
    from cluster.dask.client import TaskRunner, dask_client
    from landcover.prediction.tiled import predict_product

    spec, client = cluster_of(cluster)
    _need_tasks(spec)
    with dask_client(spec, client=client) as dask:
        return predict_product(setup, run_units=TaskRunner(dask))


def _local_ranks(rank: int, local_rank: int, local_world_size: int) -> range:
    """The ranks on the machine of `rank` (numbered in a row)."""
    first = rank - local_rank
    return range(first, first + local_world_size)


def _need_tasks(spec: ClusterSpec) -> None:
    if not engine_info(spec.engine).runs_tasks:
        raise LandcoverError(
            f'landcover.tile(cluster=...) runs its sources as tasks: engine "{spec.engine}" '
            'runs none; use engine "dask", or `landcover cluster launch` for ranks'
        )
