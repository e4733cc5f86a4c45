"""The local engine: torchrun on this machine, each simulated node one torchrun agent
(`engine`), optionally each in its own network namespace (`netns`), planned by `plan`, run by
`agents`; its cluster.json section is `network` (`section`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster._lazy import lazy_names

if TYPE_CHECKING:
    from cluster.local.engine import LocalEngine
    from cluster.local.netns import LinkShape, NetworkLayout, NodeNetwork
    from cluster.local.plan import LocalPlan, plan_local
    from cluster.local.section import NetworkSection

__all__ = [
    "LinkShape",
    "LocalEngine",
    "LocalPlan",
    "NetworkLayout",
    "NetworkSection",
    "NodeNetwork",
    "plan_local",
]
__getattr__ = lazy_names(
    __name__,
    {
        "engine": ("LocalEngine",),
        "netns": ("LinkShape", "NetworkLayout", "NodeNetwork"),
        "plan": ("LocalPlan", "plan_local"),
        "section": ("NetworkSection",),
    },
)
