"""The `dask` section of cluster.json: which Dask cluster a job runs on.

    {"engine": "dask", "targetNodeCount": 2, "processesPerNode": 1,
     "dask": {"scheduler": "tcp://10.0.0.4:8786", "threadsPerWorker": 1, "connectTimeout": "30s"}}

Without `scheduler` the launch starts a `distributed.LocalCluster` on this machine with
`targetNodeCount x processesPerNode` worker processes (`threadsPerWorker` threads each, 1 by
default) and closes it at the end. With one it connects to that scheduler as a client (a
dask-jobqueue, dask-kubernetes, Coiled or hand-started cluster): training takes
`processesPerNode` workers on each of `targetNodeCount` worker hosts as its ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, StrictInt, StrictStr

from cluster.engines import EngineRules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel
from tiling.shared.machine import cores_per_rank

# a scheduler address as distributed takes it: tcp://, tls://, ucx:// or inproc:// host:port
_SCHEDULER_RE = re.compile(r"^(tcp|tls|ucx|ws|wss)://[^\s/:]+(:\d{1,5})?/?$|^[^\s/:]+:\d{1,5}$")
_DURATION_RE = re.compile(r"^\d+(\.\d+)?(ms|s|m|h)$")
DEFAULT_CONNECT_TIMEOUT = "30s"


def _scheduler_address(value: str) -> str:
    if not _SCHEDULER_RE.match(value):
        raise ValueError('must be a scheduler address such as "tcp://10.0.0.4:8786"')
    return value


def _duration(value: str) -> str:
    if not _DURATION_RE.match(value):
        raise ValueError('must be a duration such as "30s" or "2m"')
    return value


class DaskSection(JsonModel):
    """cluster.json's `dask` object, as written."""

    scheduler: Annotated[StrictStr, AfterValidator(_scheduler_address)] | None = None
    threads_per_worker: Annotated[StrictInt, Field(ge=1)] | None = None
    connect_timeout: Annotated[StrictStr, AfterValidator(_duration)] = DEFAULT_CONNECT_TIMEOUT


@dataclass(frozen=True, slots=True)
class DaskSpec:
    """The Dask cluster: `scheduler` None starts an embedded LocalCluster."""

    scheduler: str | None = None
    threads_per_worker: int | None = None
    connect_timeout: str = DEFAULT_CONNECT_TIMEOUT

    @property
    def embedded(self) -> bool:
        """Whether the launch starts (and closes) its own LocalCluster on this machine."""
        return self.scheduler is None

    def worker_threads(self, workers: int) -> int | None:
        """`threadsPerWorker`, else on the LocalCluster a launch starts a fair share of this
        machine's cores; None on a running cluster (its VM size's share)."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return cores_per_rank(workers) if self.embedded else None

    def describe(self, workers: int) -> str:
        """Where the work runs, in words."""
        if self.embedded:
            threads = self.threads_per_worker or 1
            return f"a LocalCluster on this machine: {workers} worker processes x {threads} thread"
        return f"the Dask cluster at {self.scheduler} (connect timeout {self.connect_timeout})"


def dask_spec(raw: DaskSection | None) -> DaskSpec:
    """The checked section (none given: an embedded LocalCluster)."""
    if raw is None:
        return DaskSpec()
    if raw.scheduler is not None and raw.threads_per_worker is not None:
        raise ClusterSpecError(
            "dask.threadsPerWorker sizes the LocalCluster the launch starts; with "
            'dask.scheduler the workers are already running: drop "threadsPerWorker"'
        )
    return DaskSpec(raw.scheduler, raw.threads_per_worker, raw.connect_timeout)


class _DaskRules(EngineRules):
    model = DaskSection
    no_elastic = (
        'engine "dask" has no elastic restarts: drop "elastic" (tile and predict tasks are '
        "retried on their own; resume a failed training with --resume)"
    )

    def section(self, raw: DaskSection | None, *, name: str) -> DaskSpec:
        return dask_spec(raw)

    def ignored(self, engine: str) -> str:
        return f'the "dask" section is for engine "dask": {engine} ignores it'

    def nodes_here(self, section: DaskSpec) -> bool:
        return section.embedded


RULES = _DaskRules()
