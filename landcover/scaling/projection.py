"""Scaling arithmetic: power-law fits of measured epoch times and a projection of epoch time to
cluster sizes nobody has measured, charging each communication mode for the collectives it
really issues.

What is modelled (strong scaling of one epoch). The trainer keeps the per-worker batch `B`
fixed and splits a dataset of `S` training samples evenly across `N` workers, so

    steps(N)      = floor(floor(S / N) / B)                every rank runs this many steps
    epoch_time(N) = steps(N) · (B·compute_per_sample + (1 - overlap)·comm(N))

`comm(N)` is the sum over the collectives a rank issues per step, as the comm layer counted
them at run time (`landcover.comm.counts.CommCounts`: calls k and payload bytes b per kind),
each by its ring algorithm over a per-node link of bandwidth β and latency α:

    all-reduce  k·2(N-1)·α + 2(N-1)/N · b / β     reduce-scatter + all-gather, 2(N-1) hops
    all-gather  k·(N-1)·α  + (N-1) · b / β        every rank receives the N-1 other payloads
    broadcast   k·(N-1)·α  + b / β                pipelined along the ring

(0 when N = 1). What the modes issue, per step: none/fp16/bf16 one all-reduce of the (cast)
gradient per bucket; powersgd an all-reduce of the uncompressed tensors, of P and of Q per
bucket; onebit one all-gather of its sign bits and scales per bucket, so its bytes on the wire
grow with N: above N ≈ 64 it moves more than an fp32 all-reduce ((N-1)/8 > 8(N-1)/N bytes per
gradient value, `ONEBIT_CROSSOVER_WORKERS`); block momentum one all-reduce of the model per
block (1/block per step). DDP broadcasts no buffers (`broadcast_buffers=False`); the epoch-end
BatchNorm average is one all-reduce per epoch and is not charged.

`overlap` is the fraction of communication hidden behind backward. It cannot be measured from
the runs' epoch times alone, so it is an assumption (0 by default: communication is charged in
full, which is pessimistic where DDP overlaps buckets with backward). Not modelled either:
stragglers, input pipeline stalls, and links faster inside a node than between nodes.

`compute_per_sample` is the one fitted number: a least-squares fit of the model to the
measured epoch times in relative terms, so that a 2 s and a 200 s epoch count the same.
Speed-up and efficiency compare samples trained per second (steps(N)·N·B / epoch_time(N)),
never epoch times, which cover different sample counts. A worker count at which a worker's
shard holds fewer chips than a batch (S / N < B) is refused, never projected: the trainer
would not run it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from cluster.vmsizes import ETHERNET_10G, GBIT, NETWORKS, Network, known_vm_sizes, network_for
from landcover.comm.counts import CommCounts
from landcover.errors import ReportError

# onebit's all-gather moves (N-1)·b_1 per rank, an fp32 all-reduce 2(N-1)/N·b_32 with
# b_1 = b_32 / 32 (one bit per 32-bit value): (N-1)/32 > 2(N-1)/N ⇔ N > 64. Its per-tensor
# scales move the crossover slightly lower.
ONEBIT_CROSSOVER_WORKERS = 64

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


def ring_allreduce_time_s(
    payload_bytes: float, workers: int, network: Network, *, collectives: float = 1.0
) -> float:
    """Seconds for ring all-reduces of `payload_bytes` per worker in all, issued as
    `collectives` calls, among `workers` workers: calls·2(N-1)·latency + 2(N-1)/N · payload /
    bandwidth; zero for a single worker or an empty payload (nothing is sent, so no latency is
    paid either)."""
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    hops = 2 * (workers - 1)
    bandwidth = network.bandwidth_bytes_per_s
    return collectives * hops * network.latency_s + hops / workers * payload_bytes / bandwidth


def ring_allgather_time_s(
    payload_bytes: float, workers: int, network: Network, *, collectives: float = 1.0
) -> float:
    """Seconds for ring all-gathers of each worker's own `payload_bytes` (in all, over
    `collectives` calls): calls·(N-1)·latency + (N-1) · payload / bandwidth, since every rank
    receives the other N-1 payloads through its link."""
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    hops = workers - 1
    bandwidth = network.bandwidth_bytes_per_s
    return collectives * hops * network.latency_s + hops * payload_bytes / bandwidth


def ring_broadcast_time_s(
    payload_bytes: float, workers: int, network: Network, *, collectives: float = 1.0
) -> float:
    """Seconds for pipelined ring broadcasts of `payload_bytes` (in all, over `collectives`
    calls): calls·(N-1)·latency + payload / bandwidth."""
    if workers <= 1 or payload_bytes <= 0:
        return 0.0
    bandwidth = network.bandwidth_bytes_per_s
    return collectives * (workers - 1) * network.latency_s + payload_bytes / bandwidth


def comm_time_per_step_s(counts: CommCounts, workers: int, network: Network) -> float:
    """Seconds of communication per step of a rank issuing `counts` among `workers` workers:
    each kind of collective by its own ring formula."""
    return (
        ring_allreduce_time_s(
            counts.allreduce_bytes_per_step,
            workers,
            network,
            collectives=counts.allreduce_per_step,
        )
        + ring_allgather_time_s(
            counts.allgather_bytes_per_step,
            workers,
            network,
            collectives=counts.allgather_per_step,
        )
        + ring_broadcast_time_s(
            counts.broadcast_bytes_per_step,
            workers,
            network,
            collectives=counts.broadcast_per_step,
        )
    )


def allreduce_counts(payload_bytes: float) -> CommCounts:
    """One all-reduce of `payload_bytes` per step (none when there is nothing to send)."""
    return CommCounts(
        allreduce_per_step=1.0 if payload_bytes > 0 else 0.0,
        allreduce_bytes_per_step=payload_bytes,
    )


def fits_a_batch(samples_per_epoch: int, workers: int, batch_size: int) -> bool:
    """Whether each of `workers` workers' shards of `samples_per_epoch` holds a full batch."""
    return samples_per_epoch // workers >= batch_size


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
    """The projection model of one device and communication mode (see the module docstring).
    `counts` are the collectives per step as measured; None: one all-reduce of
    `payload_bytes` per step. `overlap_fraction` of the communication is assumed hidden."""

    compute_per_sample_s: float
    payload_bytes: float
    samples_per_epoch: int
    batch_size: int
    network: Network
    counts: CommCounts | None = None
    overlap_fraction: float = 0.0

    @property
    def collectives(self) -> CommCounts:
        return self.counts if self.counts is not None else allreduce_counts(self.payload_bytes)

    def with_network(self, network: Network) -> RingModel:
        """The same model over another link."""
        return replace(self, network=network)

    def steps(self, workers: int) -> int:
        return steps_per_epoch(self.samples_per_epoch, workers, self.batch_size)

    def fits(self, workers: int) -> bool:
        """Whether the store gives each of `workers` workers at least a batch."""
        return fits_a_batch(self.samples_per_epoch, workers, self.batch_size)

    def compute_per_step_s(self) -> float:
        return self.batch_size * self.compute_per_sample_s

    def comm_per_step_s(self, workers: int) -> float:
        """Communication charged per step: what is not hidden behind compute."""
        full = comm_time_per_step_s(self.collectives, workers, self.network)
        return (1.0 - self.overlap_fraction) * full

    def step_time_s(self, workers: int) -> float:
        return self.compute_per_step_s() + self.comm_per_step_s(workers)

    def epoch_time_s(self, workers: int) -> float:
        return self.steps(workers) * self.step_time_s(workers)

    def samples_per_s(self, workers: int) -> float:
        """Samples trained per second: full batches of every worker over the epoch time."""
        epoch_s = self.epoch_time_s(workers)
        trained = self.steps(workers) * workers * self.batch_size
        return trained / epoch_s if epoch_s > 0 else math.nan


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """Fitted compute time per sample; `clamped` when the fit came out negative (the modelled
    communication alone exceeds the measured times) and was set to zero."""

    compute_per_sample_s: float
    clamped: bool


def fit_compute_per_sample(
    points: Sequence[MeasuredPoint],
    *,
    payload_bytes: float,
    network: Network,
    counts: CommCounts | None = None,
    overlap_fraction: float = 0.0,
) -> ComputeFit:
    """Fit c in epoch_time = steps·(B·c + (1 - overlap)·comm(N)) to measured points, minimising
    the sum of squared relative errors (closed form: the model is linear in c). `counts`: the
    collectives per step (None: one all-reduce of `payload_bytes`)."""
    if not points:
        raise ReportError("no measured runs to fit the compute time per sample to")
    collectives = counts if counts is not None else allreduce_counts(payload_bytes)
    charged = 1.0 - overlap_fraction
    a = np.array([p.steps * p.batch_size / p.epoch_time_s for p in points])
    comm_share = np.array(
        [
            p.steps
            * charged
            * comm_time_per_step_s(collectives, p.workers, network)
            / p.epoch_time_s
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
    """The model at each worker count (sorted, deduplicated) at which every worker gets a full
    batch (`RingModel.fits`; the others are left out: see `refused_workers`). Speed-up and
    efficiency are samples per second relative to the model's own at `baseline_workers`;
    `measured` maps worker counts to measured epoch times for the error column."""
    measured = measured or {}
    baseline = model.samples_per_s(baseline_workers)
    points = []
    for n in sorted(set(workers)):
        if not model.fits(n) and n not in measured:
            continue
        steps = model.steps(n)
        epoch_s = model.epoch_time_s(n)
        # a zero model time only happens when the compute fit was clamped and N = 1
        speedup = model.samples_per_s(n) / baseline if epoch_s > 0 else math.nan
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


def refused_workers(model: RingModel, workers: Sequence[int]) -> tuple[int, ...]:
    """The worker counts `project` refuses: a worker's shard would hold fewer chips than a
    batch (S / N < B), so the trainer would not run there."""
    return tuple(n for n in sorted(set(workers)) if not model.fits(n))


def refusal_reason(model: RingModel, workers: Sequence[int]) -> str | None:
    """One sentence saying which worker counts are not projected and why; None: none."""
    refused = refused_workers(model, workers)
    if not refused:
        return None
    largest = model.samples_per_epoch // model.batch_size
    return (
        f"not projected to {', '.join(str(n) for n in refused)} workers: the store's "
        f"{model.samples_per_epoch} training chips give a worker fewer than a batch of "
        f"{model.batch_size} there (at most {largest} workers fit); use a larger store or a "
        "smaller --batch-size to project further"
    )
