"""What a task engine offers the code that runs a stage on it, found through the registry.

An engine that `runs_tasks` (`cluster.engines.EngineInfo`) names its `TaskEngine` in its
registry row (`EngineInfo.tasks`, "module:NAME", imported on first use). Code outside the
engines (the `landcover` stages, the Python API's `cluster=`) asks `task_engine(spec)` or
`task_engine_of_client(client)` for it and never imports an engine's module, so a new task
engine is one sub-package of `cluster` plus its registry row.

A task engine gives:
- `runner(spec, client=...)`: a context holding a `TaskRunner` for the engine's cluster (the
  one the spec names, or a client object the caller already holds, left open);
- `spec_of_client(client)`: the `ClusterSpec` of a client object of the engine's own kind
  (None when the object is not one);
- `run_ranks(spec, fn, *args, client=...)`: `fn(*args, rank=, world_size=, local_ranks=)`
  once per rank, each on a worker of its own, results in rank order (a one-COG prediction);
- `plan(spec, job, client=...)`: the engine's plan of a job's ranks, on `client` if given
  (training through the Python API);
- `describe_tasks(spec, unit)`: the lines a plan shows for a stage run as tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from cluster.engines import ENGINES, engine_info, load
from cluster.errors import ClusterError
from tiling.runtime.units import UnitRunner

if TYPE_CHECKING:
    from cluster.engine import Job, Plan
    from cluster.spec import ClusterSpec

R = TypeVar("R")


# a task engine runs units in the shape the stages hand them out in
TaskRunner = UnitRunner


@runtime_checkable
class TaskEngine(Protocol):
    """What a task engine offers (see the module docstring)."""

    def runner(
        self, spec: ClusterSpec, *, client: Any = None
    ) -> AbstractContextManager[TaskRunner]: ...

    def spec_of_client(self, client: Any) -> ClusterSpec | None: ...

    def run_ranks(
        self, spec: ClusterSpec, fn: Callable[..., R], *args: Any, client: Any = None
    ) -> list[R]: ...

    def plan(self, spec: ClusterSpec, job: Job, *, client: Any = None) -> Plan: ...

    def describe_tasks(self, spec: ClusterSpec, *, unit: str, after: str) -> list[str]: ...


def task_engine(spec: ClusterSpec) -> TaskEngine:
    """The task engine of `spec`'s engine; one line when that engine runs no tasks."""
    info = engine_info(spec.engine)
    if not info.runs_tasks or info.tasks is None:
        raise ClusterError(
            f'engine "{spec.engine}" runs no tasks; use {task_engine_names()}, or '
            "`landcover cluster launch` for ranks"
        )
    return _load_task_engine(info.tasks)


def task_engine_names() -> str:
    """The engines that run tasks, quoted, as a message names them ('"dask"')."""
    return " or ".join(f'"{name}"' for name, info in ENGINES.items() if info.runs_tasks)


def task_engine_of_client(client: Any) -> tuple[TaskEngine, ClusterSpec] | None:
    """The task engine whose kind of client `client` is, and the spec it reads from it; None
    when no task engine knows the object."""
    for info in ENGINES.values():
        if not info.runs_tasks or info.tasks is None:
            continue
        engine = _load_task_engine(info.tasks)
        spec = engine.spec_of_client(client)
        if spec is not None:
            return engine, spec
    return None


def _load_task_engine(target: str) -> TaskEngine:
    engine = load(target)
    if not isinstance(engine, TaskEngine):
        raise TypeError(f"{target} is not a cluster.tasks.TaskEngine")
    return engine
