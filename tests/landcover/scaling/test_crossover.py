"""Where compression pays off: worker counts per link and break-even bandwidths, checked
against step times worked by hand, and the report's answer to "on 16 nodes of 10 GbE, should
I use powersgd?"."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.vmsizes import GBIT, Network
from landcover.comm.counts import CommCounts
from landcover.scaling.crossover import (
    PayoffRange,
    break_even_bandwidth,
    mode_pairs,
    payoff_workers,
)
from landcover.scaling.curves import build_scaling_report
from landcover.scaling.projection import RingModel, allreduce_counts, parse_network
from landcover.scaling.report import report_markdown
from landcover.scaling.runs import load_runs
from tests.landcover.scaling.runfiles import write_run

NET_10G = Network("test-10g", 10 * GBIT, 50e-6)
GRADIENT = 100e6  # fp32 bytes per step
BUCKETS = 4
C = 0.002  # s of compute per sample
B = 8


def model(counts: CommCounts, compute_per_sample_s: float = C) -> RingModel:
    return RingModel(compute_per_sample_s, counts.bytes_per_step, 10**6, B, NET_10G, counts=counts)


NONE = model(CommCounts(allreduce_per_step=BUCKETS, allreduce_bytes_per_step=GRADIENT))
POWERSGD = model(CommCounts(allreduce_per_step=3 * BUCKETS, allreduce_bytes_per_step=1e6), 1.1 * C)


def by_hand_none(n: int, alpha: float, beta: float) -> float:
    return B * C + BUCKETS * 2 * (n - 1) * alpha + 2 * (n - 1) / n * GRADIENT / beta


def by_hand_powersgd(n: int, alpha: float, beta: float) -> float:
    return B * 1.1 * C + 3 * BUCKETS * 2 * (n - 1) * alpha + 2 * (n - 1) / n * 1e6 / beta


def test_powersgd_pays_off_at_the_worker_counts_worked_by_hand() -> None:
    # 100 MB of gradient: PowerSGD's 1 MB wins from 2 workers, until its 3x as many
    # latencies per step (2(N-1) each) outgrow the bytes it saves
    slow = Network("slow", 0.1 * GBIT, 50e-6)
    for network in (NET_10G, slow):
        alpha, beta = network.latency_s, network.bandwidth_bytes_per_s
        faster = [
            n
            for n in range(2, 4097)
            if by_hand_powersgd(n, alpha, beta) < by_hand_none(n, alpha, beta)
        ]
        assert faster == list(range(faster[0], faster[-1] + 1))  # one run of worker counts
        last = None if faster[-1] == 4096 else faster[-1]
        assert payoff_workers(POWERSGD, NONE, network) == PayoffRange(faster[0], last)
    assert payoff_workers(POWERSGD, NONE, NET_10G) == PayoffRange(2, 195)
    assert payoff_workers(POWERSGD, NONE, slow) == PayoffRange(2, None)


def test_onebit_stops_paying_off_where_its_all_gather_outgrows_the_all_reduce() -> None:
    bandwidth_only = Network("bandwidth-only", 10 * GBIT, 0.0)
    onebit = model(CommCounts(allgather_per_step=1, allgather_bytes_per_step=GRADIENT / 32))
    plain = model(allreduce_counts(GRADIENT))
    # (N-1)/32 < 2(N-1)/N ⇔ N < 64
    payoff = payoff_workers(onebit, plain, bandwidth_only)
    assert payoff == PayoffRange(2, 63)
    assert payoff.describe() == "2-63 only"
    assert PayoffRange(None, None).describe() == "never (2-4096)"
    assert PayoffRange(12, None).describe() == "from 12"


def test_break_even_bandwidth_in_closed_form() -> None:
    n, alpha = 16, 50e-6
    even = break_even_bandwidth(POWERSGD, NONE, n, latency_s=alpha)
    assert even.kind == "below" and even.bandwidth_bytes_per_s is not None
    beta = even.bandwidth_bytes_per_s
    assert by_hand_powersgd(n, alpha, beta) == pytest.approx(by_hand_none(n, alpha, beta))
    assert by_hand_powersgd(n, alpha, beta / 2) < by_hand_none(n, alpha, beta / 2)
    assert by_hand_powersgd(n, alpha, beta * 2) > by_hand_none(n, alpha, beta * 2)
    assert even.describe() == f"on links below {beta / GBIT:.3g} Gbit/s"
    # fewer bytes and no extra compute or latency: at any bandwidth
    cheaper = model(CommCounts(allreduce_per_step=BUCKETS, allreduce_bytes_per_step=GRADIENT / 2))
    assert break_even_bandwidth(cheaper, NONE, n, latency_s=alpha).kind == "always"
    # more bytes and more compute: never
    worse = model(allreduce_counts(2 * GRADIENT), 2 * C)
    assert break_even_bandwidth(worse, NONE, n, latency_s=alpha).kind == "never"
    # more bytes in fewer calls and less compute: only where bandwidth is cheap
    fewer_calls = model(allreduce_counts(1.01 * GRADIENT), 0.5 * C)
    above = break_even_bandwidth(fewer_calls, NONE, n, latency_s=alpha)
    assert above.kind == "above" and above.bandwidth_bytes_per_s is not None


def _runs(root: Path, mode: str, counts: dict[str, float], compute_s: float) -> None:
    """1, 2 and 4 workers of `mode` on 1003 chips, times made by the ring model over 10 GbE."""
    for n in (1, 2, 4):
        steps = max(1, (1003 // n) // 8)
        per_call = 2 * (n - 1) * 50e-6
        comm = 0.0
        if n > 1:
            comm = counts["calls"] * per_call + 2 * (n - 1) / n * counts["bytes"] / 1.25e9
        t = steps * (8 * compute_s + comm)
        sent = counts["bytes"] if n > 1 else 0.0
        calls = counts["calls"] if n > 1 else 0.0
        write_run(
            root,
            f"{mode}-{n}",
            workers=n,
            epoch_times=[2 * t, t],
            compression=mode,
            comm_bytes_per_step=sent,
            comm_allreduce_per_step=calls,
            comm_allreduce_bytes_per_step=sent,
            comm_allgather_per_step=0.0,
            comm_allgather_bytes_per_step=0.0,
            comm_broadcast_per_step=0.0,
            comm_broadcast_bytes_per_step=0.0,
            comm_buckets_per_step=BUCKETS if n > 1 else 0.0,
            samples_per_s=None,
        )


def test_the_report_says_whether_powersgd_pays_off_on_16_nodes_of_10_gbe(tmp_path: Path) -> None:
    _runs(tmp_path, "none", {"calls": BUCKETS, "bytes": GRADIENT}, C)
    _runs(tmp_path, "powersgd:2", {"calls": 3 * BUCKETS, "bytes": 1e6}, 1.1 * C)
    report = build_scaling_report(
        load_runs([tmp_path]), project_to=(16,), network=parse_network("10gbit:50us")
    )
    (pair,) = mode_pairs(report.curves)
    assert (pair.mode.key.compression, pair.baseline.key.compression) == ("powersgd:2", "none")
    assert pair.mode_model.compute_per_sample_s == pytest.approx(1.1 * C)
    assert pair.mode_model.collectives.allreduce_per_step == 3 * BUCKETS
    ratio = by_hand_powersgd(16, 50e-6, 1.25e9) / by_hand_none(16, 50e-6, 1.25e9)
    assert ratio < 1
    markdown = report_markdown(report)
    assert "Does compression pay off?" in markdown
    assert f"| 16 | 10gbit:50us | {ratio:.2f}× | yes |" in markdown
    first = payoff_workers(POWERSGD, NONE, parse_network("ethernet-10g")).describe()
    assert f"| {first} |" in markdown
