"""The Dask engine as a task engine (`cluster.tasks.TaskEngine`), named in its registry row.

Units of work (a source of `tile`, a tile of a tiled `predict`) run as one task each through
`cluster.dask.client.TaskRunner`; a one-COG prediction runs one rank per worker, each rank one
task pinned to its worker (`assign_ranks`); a caller's own `distributed.Client` is read as a
spec with one node per worker host (the fewest workers on a host per node).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from cluster.errors import LaunchError

if TYPE_CHECKING:
    from cluster.dask.engine import DaskPlan
    from cluster.engine import Job
    from cluster.spec import ClusterSpec
    from cluster.tasks import TaskRunner

R = TypeVar("R")


class DaskTasks:
    """Tasks and pinned ranks on a Dask cluster (see the module docstring)."""

    @contextmanager
    def runner(self, spec: ClusterSpec, *, client: Any = None) -> Iterator[TaskRunner]:
        from cluster.dask.client import TaskRunner, dask_client  # imports Dask

        with dask_client(spec, client=client) as dask:
            yield TaskRunner(dask)

    def spec_of_client(self, client: Any) -> ClusterSpec | None:
        if not hasattr(client, "scheduler") or not hasattr(client, "submit"):
            return None
        from cluster.clusterjson import parse_cluster_spec
        from cluster.dask.client import check_open, worker_hosts

        check_open(client)
        per_host = Counter(worker_hosts(client).values())
        if not per_host:
            raise LaunchError("the Dask cluster has no workers: start some, then call again")
        return parse_cluster_spec(
            {
                "engine": "dask",
                "targetNodeCount": len(per_host),
                "processesPerNode": min(per_host.values()),
                "dask": {"scheduler": client.scheduler.address},
            },
            source="distributed.Client",
        )

    def run_ranks(
        self, spec: ClusterSpec, fn: Callable[..., R], *args: Any, client: Any = None
    ) -> list[R]:
        from cluster.dask.client import dask_client, wait_for_tasks, worker_hosts
        from cluster.dask.places import assign_ranks
        from cluster.dask.remote import run_capturing
        from cluster.dask.section import DaskSpec

        section = spec.section_of(DaskSpec)
        embedded = client is None and section is not None and section.embedded
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
                    fn,
                    *args,
                    rank=p.rank,
                    world_size=world,
                    local_ranks=range(
                        p.rank - p.local_rank, p.rank - p.local_rank + p.local_world_size
                    ),
                    workers=[p.worker],
                    allow_other_workers=False,
                    pure=False,
                )
                for p in places
            ]
            # a rank's error is raised here as it was raised there (cluster.dask.remote)
            results: list[R] = wait_for_tasks(dask, futures, what="prediction ranks")
        return results

    def plan(self, spec: ClusterSpec, job: Job, *, client: Any = None) -> DaskPlan:
        from cluster.dask.engine import plan_dask

        return plan_dask(spec, job, client=client)

    def describe_tasks(self, spec: ClusterSpec, *, unit: str, after: str) -> list[str]:
        from cluster.dask.client import TASK_RETRIES
        from cluster.dask.section import DaskSpec

        where = (spec.section_of(DaskSpec) or DaskSpec()).describe(spec.workers)
        return [
            f"cluster: {spec.name}: {where}",
            f"tasks: one per {unit}, {TASK_RETRIES} retries each (a lost worker's units are "
            f"redone elsewhere); {after}",
        ]


TASKS = DaskTasks()
