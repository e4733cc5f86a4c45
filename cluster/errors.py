"""Error classes of the cluster package."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.failures import WorkerError


class ClusterError(ValueError):
    """Base class: a cluster spec or launch request that cannot be carried out."""


class ClusterSpecError(ClusterError):
    """cluster.json is malformed or inconsistent; the message names the field and the fix."""


class EngineUnavailableError(ClusterError, RuntimeError):
    """An engine's SDK, credentials or CLI tool is missing; the message says how to get it."""


class LaunchError(ClusterError, RuntimeError):
    """A launched job failed; the message says where its logs are. `worker_error`: the record
    the first failing worker left (`cluster.failures`), its message redacted, when it left one."""

    def __init__(self, message: str, *, worker_error: WorkerError | None = None) -> None:
        super().__init__(message)
        self.worker_error = worker_error
