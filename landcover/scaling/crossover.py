"""When gradient compression pays off: the worker count and the link speed at which a mode's
projected step is faster than plain all-reduce (`none`) of the same experiment.

Both come from the projection models (`landcover.scaling.projection.RingModel`) of the two
curves: each mode's own fitted compute per sample (compression costs compute) and its own
measured collectives. They compare STEP times, compute plus charged communication: at a given
worker count both modes run the same steps per epoch, so the ratio of step times is the ratio
of epoch times, and the answer does not depend on the store's size (nor on its refusals).

- `payoff_workers`: on a given link, the first worker count from which the mode is faster,
  and the last one of that run (onebit stops paying off where its all-gather outgrows an
  all-reduce, ~64 workers).
- `break_even_bandwidth`: at a given worker count and link latency, the bandwidth below which
  (or above which) the mode is faster. With comm(β) = L + A/β (latency part L, bytes part A)
  and compute c, mode m beats `none` n where c_m + g·(L_m + A_m/β) < c_n + g·(L_n + A_n/β),
  g = 1 - overlap: solved for β in closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cluster.vmsizes import ETHERNET_10G, ETHERNET_25G, GBIT, IB_EDR, Network
from landcover.scaling.curves import CurveKey, ScalingCurve
from landcover.scaling.projection import RingModel, comm_time_per_step_s

__all__ = [
    "CROSSOVER_LINKS",
    "ETHERNET_1G",
    "MAX_WORKERS",
    "BreakEven",
    "ModePair",
    "PayoffRange",
    "break_even_bandwidth",
    "mode_pairs",
    "payoff_workers",
]

ETHERNET_1G = Network("ethernet-1g", 1 * GBIT, 50e-6)
# the links the report answers for: office Ethernet, cloud Ethernet, cloud InfiniBand
CROSSOVER_LINKS = (ETHERNET_1G, ETHERNET_10G, ETHERNET_25G, IB_EDR)
MAX_WORKERS = 4096  # the largest worker count searched


@dataclass(frozen=True, slots=True)
class PayoffRange:
    """The worker counts (>= 2) from `first` to `last` at which a mode beats `none` on one link;
    `first` None: at none up to MAX_WORKERS; `last` None: from `first` on up to MAX_WORKERS."""

    first: int | None
    last: int | None

    def describe(self) -> str:
        if self.first is None:
            return f"never (2-{MAX_WORKERS})"
        if self.last is None:
            return f"from {self.first}"
        return f"{self.first}-{self.last} only"


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Where a mode beats `none` at one worker count, by link bandwidth: `always`, `never`,
    `below` or `above` `bandwidth_bytes_per_s`."""

    kind: Literal["always", "never", "below", "above"]
    bandwidth_bytes_per_s: float | None = None

    def describe(self) -> str:
        if self.kind in ("always", "never"):
            return f"{self.kind} (any bandwidth)"
        gbit = (self.bandwidth_bytes_per_s or 0.0) / GBIT
        return f"on links {self.kind} {gbit:.3g} Gbit/s"


def _step_s(model: RingModel, workers: int, network: Network) -> float:
    return model.with_network(network).step_time_s(workers)


def payoff_workers(
    mode: RingModel, baseline: RingModel, network: Network, *, max_workers: int = MAX_WORKERS
) -> PayoffRange:
    """The first run of worker counts (2..max_workers) at which `mode` steps faster than
    `baseline` over `network`."""
    first: int | None = None
    for n in range(2, max_workers + 1):
        faster = _step_s(mode, n, network) < _step_s(baseline, n, network)
        if faster and first is None:
            first = n
        elif not faster and first is not None:
            return PayoffRange(first, n - 1)
    return PayoffRange(first, None)


def _latency_and_bytes_parts(
    model: RingModel, workers: int, latency_s: float
) -> tuple[float, float]:
    """comm(β) = L + A/β of `model` at `workers` (before overlap): (L in s, A in bytes)."""
    latency = comm_time_per_step_s(model.collectives, workers, Network("l", math.inf, latency_s))
    per_byte = comm_time_per_step_s(model.collectives, workers, Network("b", 1.0, 0.0))
    return latency, per_byte


def break_even_bandwidth(
    mode: RingModel, baseline: RingModel, workers: int, *, latency_s: float
) -> BreakEven:
    """The link bandwidths at which `mode` steps faster than `baseline` at `workers` workers
    and a link latency of `latency_s` (module docstring: solved in closed form). Both models
    must assume the same overlap."""
    g = 1.0 - mode.overlap_fraction
    l_mode, a_mode = _latency_and_bytes_parts(mode, workers, latency_s)
    l_base, a_base = _latency_and_bytes_parts(baseline, workers, latency_s)
    # faster ⇔ g·(a_base - a_mode)/β > d
    d = mode.compute_per_step_s() - baseline.compute_per_step_s() + g * (l_mode - l_base)
    saved = g * (a_base - a_mode)
    if saved > 0:
        return BreakEven("always") if d <= 0 else BreakEven("below", saved / d)
    if d < 0 and saved < 0:
        return BreakEven("above", saved / d)
    return BreakEven("always") if d < 0 else BreakEven("never")


@dataclass(frozen=True, slots=True)
class ModePair:
    """A compression mode's curve and the `none` curve of the same experiment (`CurveKey`
    but the mode: device, store, model, batch, per-worker resources), both with projections."""

    mode: ScalingCurve
    baseline: ScalingCurve
    mode_model: RingModel
    baseline_model: RingModel


def mode_pairs(curves: tuple[ScalingCurve, ...]) -> tuple[ModePair, ...]:
    """Every projected curve of another mode than plain `none`, with its `none` curve."""

    def experiment(curve: ScalingCurve) -> CurveKey:
        return curve.key.experiment()

    projected = [(c, c.projection.model) for c in curves if c.projection is not None]
    baselines = {
        experiment(c): (c, model)
        for c, model in projected
        if c.key.compression == "none" and not c.key.block_momentum
    }
    pairs = []
    for curve, model in projected:
        base = baselines.get(experiment(curve))
        if base is not None and base[0] is not curve:
            pairs.append(ModePair(curve, base[0], model, base[1]))
    return tuple(pairs)
