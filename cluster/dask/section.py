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

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, StrictInt, StrictStr

from cluster.engines import EngineRules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel
from tiling.runtime.machine import cores_per_rank, local_cpu_count

# a scheduler address as distributed takes it: [tcp|tls|ucx|ws|wss://]host[:port]
_SCHEDULER_RE = re.compile(
    r"^(?:(?P<protocol>tcp|tls|ucx|ws|wss)://)?(?P<host>[^\s/:]+)(?::(?P<port>\d+))?/?$"
)
_HOSTNAME_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")
_DURATION_RE = re.compile(r"^(?P<value>\d+(\.\d+)?)(?P<unit>ms|s|m|h)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DEFAULT_CONNECT_TIMEOUT = "30s"
DEFAULT_SCHEDULER_PORT = 8786  # distributed's, for an address without one
_EXAMPLE = '"tcp://10.0.0.4:8786"'


def split_scheduler_address(value: str) -> tuple[str, str, int | None]:
    """(protocol, host, port) of a scheduler address; ValueError (one line) for anything that
    is not one: a port outside 1-65535, an IPv4 address with a part over 255, a host name that
    is no host name, or no port without a protocol."""
    match = _SCHEDULER_RE.match(value)
    if match is None:
        raise ValueError(f"must be a scheduler address such as {_EXAMPLE}")
    protocol, host, port_text = match.group("protocol", "host", "port")
    if protocol is None and port_text is None:
        raise ValueError(f"must be a scheduler address such as {_EXAMPLE}")
    port = None if port_text is None else int(port_text)
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port {port_text} is not a TCP port (1-65535): use e.g. {_EXAMPLE}")
    if re.fullmatch(r"[\d.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(
                f"{host!r} is not an IPv4 address (four numbers 0-255): use e.g. {_EXAMPLE}"
            ) from None
    elif not _HOSTNAME_RE.match(host) or len(host) > 253:
        raise ValueError(f"{host!r} is not a host name: use e.g. {_EXAMPLE}")
    return protocol or "tcp", host, port


def _scheduler_address(value: str) -> str:
    split_scheduler_address(value)
    return value


def duration_s(value: str) -> float:
    """Seconds of a duration such as "30s", "500ms", "2m" or "1h"."""
    match = _DURATION_RE.match(value)
    if match is None:
        raise ValueError('must be a duration such as "30s" or "2m"')
    return float(match.group("value")) * _UNIT_S[match.group("unit")]


def _duration(value: str) -> str:
    duration_s(value)
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

    @property
    def connect_timeout_s(self) -> float:
        """`connectTimeout` in seconds."""
        return duration_s(self.connect_timeout)

    def local_workers(self, workers: int, *, ranks: bool) -> int:
        """The worker processes of the embedded LocalCluster for a job of `workers`
        (targetNodeCount x processesPerNode): tasks run on any number of workers, so at most
        one per core of this machine; ranks need one worker each, so more ranks than cores is
        refused (one line) rather than started."""
        cores = local_cpu_count()
        if workers <= cores:
            return workers
        if ranks:
            raise ClusterSpecError(
                f"targetNodeCount x processesPerNode = {workers} ranks, one worker each, on "
                f"the LocalCluster a dask launch starts on this machine, which has {cores} "
                f"core(s): ask for at most {cores}, or name a running cluster in "
                "dask.scheduler"
            )
        return cores

    def worker_threads(self, workers: int) -> int | None:
        """`threadsPerWorker`, else on the LocalCluster a launch starts a fair share of this
        machine's cores; None on a running cluster (its VM size's share)."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return cores_per_rank(workers) if self.embedded else None

    def describe(self, workers: int) -> str:
        """Where the work runs, in words (tasks: on the LocalCluster, at most one worker per
        core)."""
        if self.embedded:
            threads = self.threads_per_worker or 1
            started = self.local_workers(workers, ranks=False)
            capped = (
                f" (targetNodeCount x processesPerNode = {workers}: at most one per core)"
                if started < workers
                else ""
            )
            return (
                f"a LocalCluster on this machine: {started} worker processes x {threads} "
                f"thread{capped}"
            )
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
