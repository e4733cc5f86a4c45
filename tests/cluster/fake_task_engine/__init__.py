"""A task engine made for the tests: what a new engine (Ray, AWS Batch) would be, a sub-package
of its own plus one registry row (`ROW`, which a test adds to `cluster.engines.ENGINES`).

Its cluster is a `FakeCluster` object the caller holds (as a notebook holds a
`distributed.Client`): `workers` workers on this machine. Units of work run as tasks on a
thread pool of that many threads, in any order, their results returned in unit order; the
ranks of a one-COG prediction run as threads of this process, one a rank; a training job's
ranks run as `python -m ENTRY ARGV` processes of this machine, one a worker, with the place
each reads (RANK, WORLD_SIZE, MASTER_ADDR, ...) in its environment. `FakeCluster.ran` records
what ran on it, so a test can tell that the work went through the engine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cluster.engine import Job, LaunchOptions, LaunchResult, Plan
from cluster.engines import EngineInfo, EngineRules
from cluster.errors import LaunchError
from cluster.spec import ClusterSpec
from tiling.runtime.rankenv import DistEnv, rank_environment

NAME = "fake"
R = TypeVar("R")


@dataclass
class FakeCluster:
    """The fake engine's client object: `workers` workers of this machine."""

    workers: int = 2
    ran: list[str] = field(default_factory=list)  # "tasks: N <what>", "ranks: N", "job: ..."


@dataclass(frozen=True)
class ThreadRunner:
    """Runs each unit as a task on a pool of `cluster.workers` threads."""

    cluster: FakeCluster

    def __call__(
        self,
        fn: Callable[..., R],
        units: Sequence[Any],
        *,
        shared: Sequence[Any] = (),
        what: str = "units",
    ) -> list[R]:
        self.cluster.ran.append(f"tasks: {len(units)} {what}")
        with ThreadPoolExecutor(self.cluster.workers) as pool:
            futures = [pool.submit(fn, *shared, unit) for unit in units]
            return [f.result() for f in futures]


@dataclass(frozen=True)
class FakePlan:
    """A training job's ranks as processes of this machine, one a worker."""

    spec: ClusterSpec
    job: Job
    cluster: FakeCluster
    engine: str = NAME

    def describe(self) -> str:
        return f"engine: {NAME}\nranks: {self.spec.workers} processes of this machine"

    def files(self) -> dict[str, str]:
        return {}


class FakeTasks:
    """The fake's `cluster.tasks.TaskEngine`."""

    @contextmanager
    def runner(self, spec: ClusterSpec, *, client: Any = None) -> Iterator[ThreadRunner]:
        yield ThreadRunner(_cluster(client))

    def spec_of_client(self, client: Any) -> ClusterSpec | None:
        if not isinstance(client, FakeCluster):
            return None
        return ClusterSpec(
            name="fake-cluster",
            engine=NAME,
            vm_size="local",
            node_count=1,
            processes_per_node=client.workers,
            gpus_per_node=0,
            vcpus_per_node=None,
        )

    def run_ranks(
        self, spec: ClusterSpec, fn: Callable[..., R], *args: Any, client: Any = None
    ) -> list[R]:
        cluster = _cluster(client)
        world = spec.workers
        cluster.ran.append(f"ranks: {world}")
        with ThreadPoolExecutor(world) as pool:  # the ranks wait for each other: all at once
            futures = [
                pool.submit(fn, *args, rank=r, world_size=world, local_ranks=range(world))
                for r in range(world)
            ]
            return [f.result() for f in futures]

    def plan(self, spec: ClusterSpec, job: Job, *, client: Any = None) -> FakePlan:
        return FakePlan(spec, job, _cluster(client))

    def describe_tasks(self, spec: ClusterSpec, *, unit: str, after: str) -> list[str]:
        return [f"cluster: {spec.name}: {spec.workers} threads", f"tasks: one per {unit}; {after}"]


class FakeEngine:
    """The fake's `cluster.engine.Engine` (the registry row's `target`): launches a
    `FakePlan`."""

    def plan(self, spec: ClusterSpec, job: Job) -> Plan:
        raise LaunchError(f'engine "{NAME}" runs on a FakeCluster object only')

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult:
        assert isinstance(plan, FakePlan)
        started = time.monotonic()
        world = plan.spec.workers
        plan.cluster.ran.append(f"job: {world} x {plan.job.entry_module}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        ranks = []
        for rank in range(world):
            place = DistEnv(rank, world, rank, world, 0, "127.0.0.1", port)
            env = {**os.environ, **plan.job.secret_env, **rank_environment(place)}
            argv = [sys.executable, "-m", plan.job.entry_module, *plan.job.bound_argv()]
            ranks.append(subprocess.Popen(argv, env=env, cwd=Path.cwd()))
        codes = [p.wait(timeout=options.timeout_s) for p in ranks]
        if any(codes):
            raise LaunchError(f"{NAME}: rank exit statuses {codes}")
        return LaunchResult(
            engine=NAME,
            job_id="fake",
            status="succeeded",
            run_dir=plan.job.output_dir,
            log_location=None,
            wall_time_s=time.monotonic() - started,
        )


def _cluster(client: Any) -> FakeCluster:
    if not isinstance(client, FakeCluster):
        raise LaunchError(f'engine "{NAME}" runs on a FakeCluster object, got {client!r}')
    return client


TASKS = FakeTasks()
RULES = EngineRules()  # no cluster.json section
ROW = EngineInfo(
    NAME,
    f"{__name__}:FakeEngine",
    f"{__name__}:RULES",
    starts_ranks=False,
    runs_tasks=True,
    runs_here=True,
    elastic_restarts=False,
    tasks=f"{__name__}:TASKS",
)
