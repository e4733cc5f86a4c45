"""The engines, by name: where each is implemented, what it can do, and what it adds to
cluster.json.

One registry: `cluster.engine.get_engine` imports an engine from here, cluster.json's `engine`
names one of these, `cluster.clusterjson` asks an engine's `EngineRules` for its section and
its checks, and code outside the engines asks an engine's capabilities
(`engine_info(name).runs_here`, `.runs_tasks`, ...) instead of comparing its name, and gets a
task engine's runner through `cluster.tasks` (never by importing the engine). Adding an
engine is a sub-package of `cluster` (its engine, its section and its rules) plus a row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, runtime_checkable

from cluster.errors import ClusterError


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """An engine and its capabilities.

    `target`: "module:Class" of its `Engine`, imported on first use (an engine's SDK is needed
    only when it is used). `rules`: "module:NAME" of its `EngineRules` (its cluster.json
    section and checks), imported when a cluster.json is read. `section`: the cluster.json key
    the engine owns; its checked value is `ClusterSpec.section` when the engine runs.
    `starts_ranks`: it starts N processes that read RANK/WORLD_SIZE (tile and predict then
    coordinate through staged parts at their output). `runs_tasks`: it schedules units of work
    as tasks on a scheduler (a source for tile, a tile or block range for predict).
    `runs_here`: its workers run on this machine and read this machine's paths (and share its
    cores), so the launcher checks a store and a run dir before starting them. `local_vm`:
    `vmSize "local"` is accepted. `needs_section`: cluster.json must have the engine's section.
    `elastic_restarts`: it restarts a failed worker group (cluster.json's `elastic`).
    `tasks`: "module:NAME" of its `cluster.tasks.TaskEngine` (an engine that `runs_tasks`),
    what code outside the engines runs a stage's tasks and ranks through.
    """

    name: str
    target: str
    rules: str
    section: str | None = None
    starts_ranks: bool = True
    runs_tasks: bool = False
    runs_here: bool = False
    local_vm: bool = False
    needs_section: bool = False
    elastic_restarts: bool = True
    tasks: str | None = None


ENGINES: dict[str, EngineInfo] = {
    info.name: info
    for info in (
        EngineInfo(
            "local",
            "cluster.local.engine:LocalEngine",
            "cluster.local.section:RULES",
            section="network",
            runs_here=True,
            local_vm=True,
        ),
        EngineInfo(
            "azureml",
            "cluster.azureml.engine:AzureMLEngine",
            "cluster.azureml.section:RULES",
            section="azureml",
            needs_section=True,
        ),
        EngineInfo(
            "kubernetes",
            "cluster.kubernetes.engine:KubernetesEngine",
            "cluster.kubernetes.section:RULES",
            section="kubernetes",
            needs_section=True,
        ),
        EngineInfo(
            "slurm",
            "cluster.slurm.engine:SlurmEngine",
            "cluster.slurm.section:RULES",
            section="slurm",
            local_vm=True,
            elastic_restarts=False,
        ),
        EngineInfo(
            "dask",
            "cluster.dask.engine:DaskEngine",
            "cluster.dask.section:RULES",
            section="dask",
            starts_ranks=False,
            runs_tasks=True,
            local_vm=True,
            elastic_restarts=False,
            tasks="cluster.dask.tasks:TASKS",
        ),
    )
}


def engine_info(name: str) -> EngineInfo:
    """The engine called `name`; one line naming the known ones otherwise."""
    info = ENGINES.get(name)
    if info is None:
        raise ClusterError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
    return info


def load(target: str) -> Any:
    """The object that a "module:NAME" target names, its module imported on first use."""
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


class EngineRules:
    """What an engine adds to cluster.json: its section (`EngineInfo.section`, read as the
    pydantic `model` and checked by `section`) and the checks that differ by engine. The
    defaults suit an engine whose nodes are this machine.

    `missing`: the error when the engine's own section is absent (None: `section(None)` is
    its default). `no_elastic`: the error for an `elastic` block on an engine without
    restarts.
    """

    model: type[Any] | None = None
    missing: str | None = None
    no_elastic: str | None = None

    def section(self, raw: Any, *, name: str) -> Any:
        """The checked section (`raw` as the model read it; None: absent) for the spec named
        `name`; one-line `ClusterSpecError`s."""
        return None

    def ignored(self, engine: str) -> str | None:
        """The note when the section is given but `engine` (another engine) runs the job."""
        return None

    def note_on(self, key: str) -> str | None:
        """This engine's own note on another engine's section `key` that it ignores (None:
        that section's `ignored` note)."""
        return None

    def gpus_per_node(self, raw: Any) -> int | None:
        """The GPUs per node the engine's own section sets (None: the VM size's)."""
        return None

    def nodes_here(self, section: Any) -> bool:
        """Whether `vmSize "local"` means this machine (else: nodes that the cluster gives,
        whose size is unknown here)."""
        return True


@runtime_checkable
class SharesCores(Protocol):
    """A checked section that sets the CPU threads of each worker."""

    def worker_threads(self, workers: int) -> int | None: ...


@cache
def engine_rules(name: str) -> EngineRules:
    """The rules of the engine called `name` (its section module imported on first use)."""
    rules: EngineRules = load(engine_info(name).rules)
    return rules
