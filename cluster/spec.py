"""`ClusterSpec`: a validated cluster description — the engine, the nodes and the processes on
each, elastic restarts, where the data is, and the running engine's own settings (one
section, which the engine itself parses: `cluster.engines.EngineRules.section`).

It is read from cluster.json by `cluster.clusterjson.load_cluster_spec`, or made for this
machine by `local_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from cluster.errors import ClusterError, ClusterSpecError
from cluster.redact import Redactor
from cluster.vmsizes import LOCAL
from tiling.runtime.machine import local_cpu_count, local_gpu_count

if TYPE_CHECKING:  # the JSON schema's names (pydantic): not imported to run a spec
    from cluster.specfile import DataMode, EngineName

S = TypeVar("S")

Priority = Literal["dedicated", "lowpriority"]


@dataclass(frozen=True, slots=True)
class ElasticSpec:
    """Elastic training: run on min..max nodes, restart the worker group up to max_restarts."""

    min_nodes: int
    max_nodes: int
    max_restarts: int


@dataclass(frozen=True, slots=True)
class DataSpec:
    """Where the chip store lives for the cluster and how jobs reach it."""

    url: str | None = None
    mode: DataMode = "mount"
    account_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlobMount:
    """A blob container the legacy nodeSetup mounted (credentials are never kept here)."""

    account_name: str
    container_name: str
    relative_mount_path: str


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A validated cluster description. Build it with `load_cluster_spec` or `local_spec`."""

    name: str
    engine: EngineName
    vm_size: str  # canonical Azure name, or "local"
    node_count: int  # targetNodeCount
    processes_per_node: int  # resolved: never "auto"
    gpus_per_node: int | None  # None: a VM size missing from cluster/vmsizes.py
    vcpus_per_node: int | None
    vm_priority: Priority = "dedicated"
    elastic: ElasticSpec | None = None
    data: DataSpec = DataSpec()
    mounts: tuple[BlobMount, ...] = ()
    setup_command: str | None = None
    # the running engine's own cluster.json section, as its rules checked it (its
    # `EngineInfo.section`: `azureml`, `kubernetes`, `slurm`, `dask`, or the local engine's
    # `network`); None where the file has none and the engine has no default
    section: Any = None
    # what the file said that no engine acts on, shown in plans
    notes: tuple[str, ...] = field(default=(), compare=False)
    # literal secret values from the file, kept only to scrub them from output
    secret_values: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def workers(self) -> int:
        return self.node_count * self.processes_per_node

    @property
    def max_restarts(self) -> int:
        return self.elastic.max_restarts if self.elastic else 0

    @property
    def max_nodes(self) -> int:
        return max(self.node_count, self.elastic.max_nodes if self.elastic else 0)

    def redactor(self) -> Redactor:
        return Redactor(self.secret_values)

    def section_of(self, kind: type[S]) -> S | None:
        """The engine's section when it is a `kind` (the engine's own section type), else
        None: an engine reads its own settings through this, typed."""
        return self.section if isinstance(self.section, kind) else None

    def required_section(self, kind: type[S]) -> S:
        """The engine's section, a `kind`, for an engine that cannot run without one;
        ClusterError naming the engine when the spec has none."""
        section = self.section_of(kind)
        if section is None:
            article = "an" if self.engine[:1] in tuple("aeiou") else "a"
            raise ClusterError(
                f'engine "{self.engine}" needs {article} "{self.engine}" section in cluster.json'
            )
        return section


def local_spec(workers: int, *, name: str = "local", max_restarts: int = 0) -> ClusterSpec:
    """The spec `landcover scale` uses without --cluster: this machine, one node, N processes."""
    if workers < 1:
        raise ClusterSpecError(f"workers must be >= 1, got {workers}")
    return ClusterSpec(
        name=name,
        engine="local",
        vm_size=LOCAL,
        node_count=1,
        processes_per_node=workers,
        gpus_per_node=local_gpu_count(),
        vcpus_per_node=local_cpu_count(),
        elastic=ElasticSpec(1, 1, max_restarts) if max_restarts else None,
    )
