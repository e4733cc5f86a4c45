"""The dask engine: tile and predict units as Dask tasks, training ranks as one task per rank
on the workers (`engine`, `rank`), through a client for the cluster.json's Dask cluster
(`client`); its cluster.json section is `dask` (`section`). Inside this package `import dask`
still means the library (absolute imports); Dask itself is imported only when a client is
made."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster._lazy import lazy_names

if TYPE_CHECKING:
    from cluster.dask.client import TaskRunner, dask_client
    from cluster.dask.engine import DaskEngine, DaskPlan, plan_dask
    from cluster.dask.section import DaskSection, DaskSpec

__all__ = [
    "DaskEngine",
    "DaskPlan",
    "DaskSection",
    "DaskSpec",
    "TaskRunner",
    "dask_client",
    "plan_dask",
]
__getattr__ = lazy_names(
    __name__,
    {
        "client": ("TaskRunner", "dask_client"),
        "engine": ("DaskEngine", "DaskPlan", "plan_dask"),
        "section": ("DaskSection", "DaskSpec"),
    },
)
