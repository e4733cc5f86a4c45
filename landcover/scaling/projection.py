"""Scaling arithmetic: power-law fits of measured epoch times and a ring-model projection of
epoch time to cluster sizes nobody has measured.

What is modelled (strong scaling of one epoch). The trainer keeps the per-worker batch `B`
fixed and splits a dataset of `S` training samples evenly across `N` workers, so

    steps(N)      = floor(floor(S / N) / B)                every rank runs this many steps
    comm(N)       = 2(N-1)·latency + 2(N-1)/N · payload / bandwidth     (0 when N = 1)
    epoch_time(N) = steps(N) · (B·compute_per_sample + comm(N))

`comm(N)` is a ring all-reduce: a reduce-scatter and an all-gather of N-1 steps each, every
step one message of payload/N bytes per worker, hence 2(N-1) latencies and 2(N-1)/N of the
payload through each worker's link. `payload` is a mode's measured `comm_bytes_per_step`
(what a rank hands to the all-reduce per step, after compression). `bandwidth` is per node
and intra-node links are assumed faster than it. Not modelled: overlap of communication with
backward (the model charges comm in full, so it is pessimistic there), stragglers, input
pipeline stalls, and the per-block (not per-step) latency of block momentum.

`compute_per_sample` is the one fitted number: a least-squares fit of the model to the
measured epoch times in relative terms, so that a 2 s and a 200 s epoch count the same.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cluster.vmsizes import ETHERNET_10G, GBIT, NETWORKS, Network, known_vm_sizes, network_for
from landcover.errors import ReportError

# The network a projection assumes when neither --network nor the runs' vmSize names one:
# plain 10 Gbit/s Ethernet, the slowest interconnect in the VM table, so projections err low.
DEFAULT_NETWORK = ETHERNET_10G

# Latency assumed for a `--network 25gbit` that gives no `:<us>us` part (Ethernet-like).
DEFAULT_LATENCY_S = 50e-6

_CUSTOM_NETWORK = re.compile(
    r"^\s*(?P<gbit>\d+(?:\.\d*)?|\.\d+)\s*gbit(?:/s)?\s*(?::\s*(?P<us>\d+(?:\.\d*)?|\.\d+)\s*us)?\s*$",
    re.IGNORECASE,
)


def parse_network(text: str) -> Network:
    """A network from `--network`: a name in `cluster.vmsizes.NETWORKS`, a VM size
    (`Standard_NC24rs_v3`), or `<Gbit/s>gbit[:<latency_us>us]` (`25gbit:30us`)."""
    named = network_for(text.strip())
    if named is not None:
        return named
    match = _CUSTOM_NETWORK.match(text)
    if match is not None:
        gbit = float(match["gbit"])
        latency_us = float(match["us"]) if match["us"] is not None else DEFAULT_LATENCY_S * 1e6
        if gbit > 0:
            return Network(f"{gbit:g}gbit:{latency_us:g}us", gbit * GBIT, latency_us * 1e-6)
    raise ReportError(
        f"--network {text!r}: not a network name, a VM size or '<Gbit/s>gbit[:<latency_us>us]' "
        f"with a positive bandwidth; use one of {', '.join(NETWORKS)}, a VM size such as "
        f"{known_vm_sizes()[3]}, or e.g. 25gbit:30us"
    )


def describe_network(network: Network) -> str:
    """`ethernet-10g (10 Gbit/s, 50 µs)`."""
    return (
        f"{network.name} ({network.bandwidth_gbit_per_s:g} Gbit/s, "
        f"{network.latency_s * 1e6:g} µs latency)"
    )


def ring_allreduce_time_s(payload_bytes: float, workers: int, network: Network) -> float:
    """Seconds for one ring all-reduce of `payload_bytes` per worker among `workers` workers:
    2(N-1)·latency + 2(N-1)/N · payload / bandwidth; zero for a single worker or an empty
    payload (nothing is sent, so no latency is paid either)."""
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    hops = 2 * (workers - 1)
    return hops * network.latency_s + hops / workers * payload_bytes / network.bandwidth_bytes_per_s


def steps_per_epoch(samples_per_epoch: int, workers: int, batch_size: int) -> int:
    """Steps every rank runs when `samples_per_epoch` are split evenly over `workers` ranks
    with a per-worker batch of `batch_size`: the trainer drops a short last batch and the
    smallest shard decides (`landcover.data.shards.steps_per_epoch`). At least one step, so that a
    projection past the point where shards hold less than a batch stays defined."""
    return max(1, (samples_per_epoch // workers) // batch_size)


@dataclass(frozen=True, slots=True)
class PowerLawFit:
    """epoch_time ≈ exp(log_intercept) · workers**exponent, fitted in log-log space."""

    log_intercept: float
    exponent: float
    r_squared: float
    points: int

    def predict(self, workers: float) -> float:
        return math.exp(self.log_intercept + self.exponent * math.log(workers))


def fit_power_law(workers: Sequence[float], epoch_times_s: Sequence[float]) -> PowerLawFit:
    """Least squares of log(epoch_time) = a + b·log(workers); b is -1 for ideal scaling."""
    if len(workers) != len(epoch_times_s):
        raise ValueError("workers and epoch_times_s differ in length")
    x = np.log(np.asarray(workers, dtype=np.float64))
    y = np.log(np.asarray(epoch_times_s, dtype=np.float64))
    if len(set(x.tolist())) < 2:
        raise ReportError(
            "a power-law fit needs runs at two or more worker counts; "
            f"got worker counts {sorted(set(workers))}"
        )
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    spread = float(np.sum((y - y.mean()) ** 2))
    r_squared = 1.0 - float(np.sum(residual**2)) / spread if spread > 0 else 1.0
    return PowerLawFit(float(intercept), float(slope), r_squared, len(x))


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    """One measured run, reduced to what the ring model needs."""

    workers: int
    steps: int
    batch_size: int
    epoch_time_s: float


@dataclass(frozen=True, slots=True)
class RingModel:
    """The projection model of one device and communication mode (see the module docstring)."""

    compute_per_sample_s: float
    payload_bytes: float
    samples_per_epoch: int
    batch_size: int
    network: Network

    def steps(self, workers: int) -> int:
        return steps_per_epoch(self.samples_per_epoch, workers, self.batch_size)

    def compute_per_step_s(self) -> float:
        return self.batch_size * self.compute_per_sample_s

    def comm_per_step_s(self, workers: int) -> float:
        return ring_allreduce_time_s(self.payload_bytes, workers, self.network)

    def epoch_time_s(self, workers: int) -> float:
        return self.steps(workers) * (self.compute_per_step_s() + self.comm_per_step_s(workers))


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """Fitted compute time per sample; `clamped` when the fit came out negative (the modelled
    communication alone exceeds the measured times) and was set to zero."""

    compute_per_sample_s: float
    clamped: bool


def fit_compute_per_sample(
    points: Sequence[MeasuredPoint], *, payload_bytes: float, network: Network
) -> ComputeFit:
    """Fit c in epoch_time = steps·(B·c + comm(N)) to measured points, minimising the sum of
    squared relative errors (closed form: the model is linear in c)."""
    if not points:
        raise ReportError("no measured runs to fit the compute time per sample to")
    a = np.array([p.steps * p.batch_size / p.epoch_time_s for p in points])
    comm_share = np.array(
        [
            p.steps * ring_allreduce_time_s(payload_bytes, p.workers, network) / p.epoch_time_s
            for p in points
        ]
    )
    c = float(np.sum(a * (1.0 - comm_share)) / np.sum(a * a))
    if c < 0:
        return ComputeFit(0.0, clamped=True)
    return ComputeFit(c, clamped=False)


@dataclass(frozen=True, slots=True)
class ProjectedPoint:
    """The model's epoch time at one worker count, with the measurement where there is one."""

    workers: int
    steps: int
    compute_s: float  # per epoch
    comm_s: float  # per epoch
    epoch_time_s: float
    speedup: float
    efficiency: float
    measured_epoch_time_s: float | None

    @property
    def relative_error(self) -> float | None:
        """(projected - measured) / measured, where measured."""
        if self.measured_epoch_time_s is None:
            return None
        return (self.epoch_time_s - self.measured_epoch_time_s) / self.measured_epoch_time_s


def project(
    model: RingModel,
    workers: Sequence[int],
    *,
    baseline_workers: int,
    measured: dict[int, float] | None = None,
) -> tuple[ProjectedPoint, ...]:
    """The model at each worker count (sorted, deduplicated). Speed-up and efficiency are
    relative to the model's own time at `baseline_workers`; `measured` maps worker counts to
    measured epoch times for the error column."""
    measured = measured or {}
    baseline_s = model.epoch_time_s(baseline_workers)
    points = []
    for n in sorted(set(workers)):
        steps = model.steps(n)
        epoch_s = model.epoch_time_s(n)
        # a zero model time only happens when the compute fit was clamped and N = 1
        speedup = baseline_s / epoch_s if epoch_s > 0 else math.nan
        points.append(
            ProjectedPoint(
                workers=n,
                steps=steps,
                compute_s=steps * model.compute_per_step_s(),
                comm_s=steps * model.comm_per_step_s(n),
                epoch_time_s=epoch_s,
                speedup=speedup,
                efficiency=speedup * baseline_workers / n,
                measured_epoch_time_s=measured.get(n),
            )
        )
    return tuple(points)
