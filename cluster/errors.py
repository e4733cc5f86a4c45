"""Error classes of the cluster package."""

from __future__ import annotations


class ClusterError(ValueError):
    """Base class: a cluster spec or launch request that cannot be carried out."""


class ClusterSpecError(ClusterError):
    """cluster.json is malformed or inconsistent; the message names the field and the fix."""


class EngineUnavailableError(ClusterError, RuntimeError):
    """An engine's SDK, credentials or CLI tool is missing; the message says how to get it."""


class LaunchError(ClusterError, RuntimeError):
    """A launched job failed; the message says where its logs are."""
