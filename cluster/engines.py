"""The engines, by name: where each is implemented and what it can do.

One registry: `cluster.engine.get_engine` imports an engine from here, cluster.json's `engine`
names one of these, and code outside the engines asks an engine's capabilities
(`engine_info(name).runs_here`, `.runs_tasks`, ...) instead of comparing its name. Adding an
engine is a row here plus its module(s).
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.errors import ClusterError


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """An engine and its capabilities.

    `target`: "module:Class" of its `Engine`, imported on first use (an engine's SDK is needed
    only when it is used). `starts_ranks`: it starts N processes that read RANK/WORLD_SIZE
    (tile and predict then coordinate through staged parts at their output). `runs_tasks`: it
    schedules units of work as tasks on a scheduler (a source for tile, a tile or block range
    for predict). `runs_here`: its workers may run on this machine and read this machine's
    paths, so the launcher checks a store and a run dir before starting them. `local_vm`:
    `vmSize "local"` (this machine's size) is accepted. `needs_section`: cluster.json must
    have a section of the engine's name.
    """

    name: str
    target: str
    starts_ranks: bool = True
    runs_tasks: bool = False
    runs_here: bool = False
    local_vm: bool = False
    needs_section: bool = False


ENGINES: dict[str, EngineInfo] = {
    info.name: info
    for info in (
        EngineInfo("local", "cluster.local:LocalEngine", runs_here=True, local_vm=True),
        EngineInfo("azureml", "cluster.azureml:AzureMLEngine", needs_section=True),
        EngineInfo("kubernetes", "cluster.kubernetes:KubernetesEngine", needs_section=True),
        EngineInfo("slurm", "cluster.slurm:SlurmEngine", local_vm=True),
        EngineInfo(
            "dask",
            "cluster.daskengine:DaskEngine",
            starts_ranks=False,
            runs_tasks=True,
            local_vm=True,
        ),
    )
}


def engine_info(name: str) -> EngineInfo:
    """The engine called `name`; one line naming the known ones otherwise."""
    info = ENGINES.get(name)
    if info is None:
        raise ClusterError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}")
    return info
