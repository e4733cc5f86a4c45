"""The local engine's section of cluster.json, `network`: each simulated node in its own
network namespace behind a link of that shape (`cluster.local.netns`).

    "network": {"bandwidth": "1gbit", "latency": "2ms"}

`bandwidth` is a tc rate ("100mbit", "1gbit"); `latency` a one-way delay, which needs the
kernel's netem (refused at launch where the kernel has none). It needs root at launch. Other
engines ignore it (with a note in their plan).
"""

from __future__ import annotations

from pydantic import StrictStr

from cluster.engines import EngineRules
from cluster.jsonmodel import JsonModel
from cluster.local.netns import LinkShape, parse_duration_s, parse_rate


class NetworkSection(JsonModel):
    """cluster.json's `network` object, as written."""

    bandwidth: StrictStr | None = None
    latency: StrictStr | None = None


def network_shape(raw: NetworkSection) -> LinkShape:
    """The link each simulated node is behind; one-line errors."""
    rate = None if raw.bandwidth is None else parse_rate(raw.bandwidth)
    delay = None if raw.latency is None else parse_duration_s(raw.latency)
    return LinkShape(rate_bits_per_s=rate, delay_s=delay or None)


class _LocalRules(EngineRules):
    model = NetworkSection

    def section(self, raw: NetworkSection | None, *, name: str) -> LinkShape | None:
        return None if raw is None else network_shape(raw)

    def ignored(self, engine: str) -> str:
        return f"network is emulated by the local engine only: {engine} ignores it"


RULES = _LocalRules()
