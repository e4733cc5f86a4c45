"""Ring model, power-law fit and network parsing, checked against numbers worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.vmsizes import GBIT, IB_EDR, IB_FDR, Network
from landcover.comm.counts import CommCounts
from landcover.errors import ReportError
from landcover.scaling.projection import (
    DEFAULT_LATENCY_S,
    ONEBIT_CROSSOVER_WORKERS,
    MeasuredPoint,
    RingModel,
    allreduce_counts,
    comm_time_per_step_s,
    fit_compute_per_sample,
    fit_power_law,
    parse_network,
    project,
    refusal_reason,
    refused_workers,
    ring_allgather_time_s,
    ring_allreduce_time_s,
    ring_broadcast_time_s,
    steps_per_epoch,
)

NET_10G = Network("test-10g", 10 * GBIT, 50e-6)


def test_ring_allreduce_by_hand() -> None:
    # 4 workers, 100 MB over 10 Gbit/s (1.25e9 B/s), 50 µs:
    # 2·3 latencies = 300 µs, 2·3/4 · 1e8 / 1.25e9 = 0.12 s
    assert ring_allreduce_time_s(100e6, 4, NET_10G) == pytest.approx(0.0003 + 0.12, rel=1e-12)
    # 148 workers, 4 MB: 294 · 50 µs + 294/148 · 4e6 / 1.25e9
    expected = 294 * 50e-6 + 294 / 148 * 4e6 / 1.25e9
    assert ring_allreduce_time_s(4e6, 148, NET_10G) == pytest.approx(expected, rel=1e-12)


def test_ring_allreduce_is_free_for_one_worker_or_nothing_to_send() -> None:
    assert ring_allreduce_time_s(1e9, 1, NET_10G) == 0.0
    assert ring_allreduce_time_s(0.0, 64, NET_10G) == 0.0


def test_steps_per_epoch_drops_a_short_last_batch_like_the_trainer() -> None:
    assert steps_per_epoch(1000, 1, 8) == 125
    assert steps_per_epoch(1000, 3, 8) == 41  # 333 samples per rank → 41 full batches
    assert steps_per_epoch(1000, 148, 8) == 1
    assert steps_per_epoch(1000, 5000, 8) == 1


def test_power_law_recovers_the_exponent() -> None:
    workers = [1, 2, 4, 8, 16]
    fit = fit_power_law(workers, [100 * n**-0.8 for n in workers])
    assert fit.exponent == pytest.approx(-0.8, abs=1e-12)
    assert math.exp(fit.log_intercept) == pytest.approx(100, rel=1e-12)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.predict(148) == pytest.approx(100 * 148**-0.8, rel=1e-12)


def test_power_law_matches_numpy_least_squares_on_noisy_times() -> None:
    rng = np.random.default_rng(7)
    workers = np.array([1, 2, 3, 4, 6, 8])
    times = 50 * workers**-0.7 * np.exp(rng.normal(0, 0.05, workers.size))
    fit = fit_power_law(workers.tolist(), times.tolist())
    design = np.stack([np.ones(workers.size), np.log(workers)], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, np.log(times), rcond=None)
    assert fit.exponent == pytest.approx(b, rel=1e-9)
    assert fit.log_intercept == pytest.approx(a, rel=1e-9)
    assert 0.9 < fit.r_squared < 1.0


def test_power_law_needs_two_worker_counts() -> None:
    with pytest.raises(ReportError, match=r"two or more worker counts; got worker counts \[4\]"):
        fit_power_law([4, 4], [10.0, 11.0])


def _points(model: RingModel, workers: list[int]) -> list[MeasuredPoint]:
    return [
        MeasuredPoint(n, model.steps(n), model.batch_size, model.epoch_time_s(n)) for n in workers
    ]


def test_compute_fit_recovers_the_model_that_made_the_times() -> None:
    truth = RingModel(
        compute_per_sample_s=0.01,
        payload_bytes=4e6,
        samples_per_epoch=1000,
        batch_size=8,
        network=NET_10G,
    )
    fit = fit_compute_per_sample(_points(truth, [1, 2, 4]), payload_bytes=4e6, network=NET_10G)
    assert not fit.clamped
    assert fit.compute_per_sample_s == pytest.approx(0.01, rel=1e-12)


def test_compute_fit_minimises_relative_error_in_closed_form() -> None:
    # no communication: epoch = steps·B·c; relative least squares gives c = Σa / Σa², a = steps·B/t
    points = [MeasuredPoint(1, 100, 10, 20.0), MeasuredPoint(2, 50, 10, 12.0)]
    a = np.array([100 * 10 / 20.0, 50 * 10 / 12.0])
    fit = fit_compute_per_sample(points, payload_bytes=0.0, network=NET_10G)
    assert fit.compute_per_sample_s == pytest.approx(a.sum() / (a * a).sum(), rel=1e-12)


def test_compute_fit_clamps_when_comm_alone_is_slower_than_measured() -> None:
    points = [MeasuredPoint(8, 10, 8, 0.01)]  # 0.01 s for 10 steps, each with a 1 GB all-reduce
    fit = fit_compute_per_sample(points, payload_bytes=1e9, network=NET_10G)
    assert fit.clamped
    assert fit.compute_per_sample_s == 0.0


def test_project_by_hand() -> None:
    model = RingModel(
        compute_per_sample_s=0.01,
        payload_bytes=4e6,
        samples_per_epoch=1000,
        batch_size=8,
        network=NET_10G,
    )
    points = project(model, [64, 1, 4, 4], baseline_workers=1, measured={4: 3.0})
    assert [p.workers for p in points] == [1, 4, 64]
    one, four, sixty_four = points
    assert one.epoch_time_s == pytest.approx(125 * 0.08)
    # 4 workers: 250 samples each → 31 full batches · (0.08 + 6·50e-6 + 1.5·4e6/1.25e9)
    comm4 = 6 * 50e-6 + 1.5 * 4e6 / 1.25e9
    assert four.steps == 31
    assert four.comm_s == pytest.approx(31 * comm4)
    assert four.epoch_time_s == pytest.approx(31 * (0.08 + comm4))
    assert four.relative_error == pytest.approx((31 * (0.08 + comm4) - 3.0) / 3.0)
    # 64 workers: 15 samples each, a batch of 8 fits once → 1 step
    comm64 = 126 * 50e-6 + 126 / 64 * 4e6 / 1.25e9
    assert sixty_four.steps == 1
    assert sixty_four.epoch_time_s == pytest.approx(1 * (0.08 + comm64))
    # speed-up in samples trained per second: 64 × 8 samples in one step against 1000 in 10 s
    rate64 = 64 * 8 / (1 * (0.08 + comm64))
    assert sixty_four.speedup == pytest.approx(rate64 / (1000 / 10.0))
    assert sixty_four.efficiency == pytest.approx(sixty_four.speedup / 64)
    assert sixty_four.relative_error is None


@pytest.mark.parametrize(
    ("text", "bandwidth_gbit", "latency_s"),
    [
        ("infiniband-edr-100g", 100, IB_EDR.latency_s),
        ("Standard_NC24r", 56, IB_FDR.latency_s),
        ("standard_nc24r", 56, IB_FDR.latency_s),
        ("25gbit:30us", 25, 30e-6),
        ("12.5Gbit/s", 12.5, DEFAULT_LATENCY_S),
        (" 400gbit : 1.5us ", 400, 1.5e-6),
    ],
)
def test_parse_network(text: str, bandwidth_gbit: float, latency_s: float) -> None:
    network = parse_network(text)
    assert network.bandwidth_gbit_per_s == pytest.approx(bandwidth_gbit)
    assert network.latency_s == pytest.approx(latency_s)


@pytest.mark.parametrize("text", ["fast", "0gbit", "10mbit", "10gbit:fast", ""])
def test_parse_network_rejects_with_the_choices(text: str) -> None:
    with pytest.raises(ReportError, match=r"not a network name.*infiniband-edr-100g.*25gbit:30us"):
        parse_network(text)


@given(
    payload=st.floats(0, 1e10),
    workers=st.integers(2, 10_000),
    gbit=st.floats(0.1, 4000),
    latency_us=st.floats(0, 1000),
)
def test_ring_time_grows_with_workers_and_stays_under_twice_the_payload(
    payload: float, workers: int, gbit: float, latency_us: float
) -> None:
    network = Network("n", gbit * GBIT, latency_us * 1e-6)
    now = ring_allreduce_time_s(payload, workers, network)
    assert ring_allreduce_time_s(payload, workers + 1, network) >= now
    bound = 2 * payload / network.bandwidth_bytes_per_s + 2 * (workers - 1) * network.latency_s
    assert now <= bound * (1 + 1e-12)


# -- per collective ------------------------------------------------------------------------

MB = 1e6
GRADIENT = 100 * MB  # fp32 gradient bytes per step (25 M parameters)


def test_allgather_and_broadcast_by_hand() -> None:
    # 8 workers, 3 MB of own payload in 2 calls: 2·7 latencies + 7 · 3e6 / 1.25e9
    assert ring_allgather_time_s(3 * MB, 8, NET_10G, collectives=2) == pytest.approx(
        2 * 7 * 50e-6 + 7 * 3e6 / 1.25e9, rel=1e-12
    )
    assert ring_broadcast_time_s(3 * MB, 8, NET_10G) == pytest.approx(
        7 * 50e-6 + 3e6 / 1.25e9, rel=1e-12
    )
    assert ring_allgather_time_s(3 * MB, 1, NET_10G) == 0.0


@pytest.mark.parametrize("workers", [2, 16, 148])
def test_each_mode_costs_what_its_collectives_cost_by_hand(workers: int) -> None:
    n, alpha, beta = workers, 50e-6, 1.25e9
    buckets = 4
    allreduce = 2 * (n - 1) * alpha, 2 * (n - 1) / n / beta  # per call, per byte
    modes = {
        # none: 4 buckets of the fp32 gradient
        "none": (
            CommCounts(allreduce_per_step=buckets, allreduce_bytes_per_step=GRADIENT),
            buckets * allreduce[0] + GRADIENT * allreduce[1],
        ),
        # fp16/bf16: the same calls, half the bytes
        "fp16": (
            CommCounts(allreduce_per_step=buckets, allreduce_bytes_per_step=GRADIENT / 2),
            buckets * allreduce[0] + GRADIENT / 2 * allreduce[1],
        ),
        # powersgd: 3 rounds per bucket (uncompressed, P, Q) of 1 MB in all
        "powersgd": (
            CommCounts(allreduce_per_step=3 * buckets, allreduce_bytes_per_step=1 * MB),
            3 * buckets * allreduce[0] + 1 * MB * allreduce[1],
        ),
        # onebit: one all-gather per bucket of a 32nd of the gradient
        "onebit": (
            CommCounts(allgather_per_step=buckets, allgather_bytes_per_step=GRADIENT / 32),
            buckets * (n - 1) * alpha + (n - 1) * GRADIENT / 32 / beta,
        ),
        # bmuf, block of 8 steps: a model all-reduce every 8th step
        "bmuf": (
            CommCounts(allreduce_per_step=1 / 8, allreduce_bytes_per_step=GRADIENT / 8),
            allreduce[0] / 8 + GRADIENT / 8 * allreduce[1],
        ),
    }
    for mode, (counts, by_hand) in modes.items():
        assert comm_time_per_step_s(counts, n, NET_10G) == pytest.approx(by_hand, rel=1e-12), mode


def test_powersgd_pays_a_latency_per_round_and_bucket() -> None:
    # the same bytes in 3 rounds × 10 buckets instead of one all-reduce: 29 more latencies each
    # of 2(N-1) hops
    one = comm_time_per_step_s(allreduce_counts(1 * MB), 16, NET_10G)
    rounds = CommCounts(allreduce_per_step=30, allreduce_bytes_per_step=1 * MB)
    assert comm_time_per_step_s(rounds, 16, NET_10G) - one == pytest.approx(29 * 30 * 50e-6)


def _onebit_beats_fp32(workers: int) -> bool:
    onebit = CommCounts(allgather_per_step=1, allgather_bytes_per_step=GRADIENT / 32)
    fp32 = allreduce_counts(GRADIENT)
    slow = Network("bandwidth-only", 10 * GBIT, 0.0)
    return comm_time_per_step_s(onebit, workers, slow) < comm_time_per_step_s(fp32, workers, slow)


def test_onebit_all_gather_costs_more_than_fp32_all_reduce_above_64_workers() -> None:
    # (N-1)·b/32 against 2(N-1)/N·b: equal at N = 64
    assert ONEBIT_CROSSOVER_WORKERS == 64
    assert all(_onebit_beats_fp32(n) for n in range(2, 64))
    assert not any(_onebit_beats_fp32(n) for n in range(65, 300))
    # the case: 148 workers on 10 GbE, 4 MB of fp32 gradient: onebit is ~1.2x slower,
    # never 6x cheaper
    onebit = CommCounts(allgather_per_step=1, allgather_bytes_per_step=4 * MB / 32)
    ratio = comm_time_per_step_s(onebit, 148, NET_10G) / comm_time_per_step_s(
        allreduce_counts(4 * MB), 148, NET_10G
    )
    assert ratio > 1


def test_overlap_hides_that_fraction_of_the_communication() -> None:
    counts = allreduce_counts(4 * MB)
    full = RingModel(0.01, 4 * MB, 1000, 8, NET_10G, counts=counts)
    half = RingModel(0.01, 4 * MB, 1000, 8, NET_10G, counts=counts, overlap_fraction=0.5)
    assert half.comm_per_step_s(4) == pytest.approx(full.comm_per_step_s(4) / 2)
    assert half.step_time_s(4) == pytest.approx(0.08 + full.comm_per_step_s(4) / 2)


def test_projection_refuses_worker_counts_whose_shards_hold_less_than_a_batch() -> None:
    # 55 chips in batches of 8: 6 workers get 9 chips (1 batch), 7 get 7 (none)
    model = RingModel(0.01, 4 * MB, 55, 8, NET_10G)
    points = project(model, [1, 2, 6, 7, 64], baseline_workers=1)
    assert [p.workers for p in points] == [1, 2, 6]
    assert refused_workers(model, [1, 2, 6, 7, 64]) == (7, 64)
    reason = refusal_reason(model, [7, 64])
    assert reason is not None
    assert reason.startswith("not projected to 7, 64 workers: the store's 55 training chips")
    assert "(at most 6 workers fit)" in reason
    assert refusal_reason(model, [2, 6]) is None


def test_efficiency_never_exceeds_100_percent_from_a_sample_count_artefact() -> None:
    # 1003 chips, batch 8: 1 worker trains 125 batches, 8 workers 15 each (960 samples);
    # without communication the 8-worker epoch is 120/125 of the time per worker's samples
    model = RingModel(0.01, 0.0, 1003, 8, NET_10G)
    one, eight = project(model, [1, 8], baseline_workers=1)
    assert one.epoch_time_s / eight.epoch_time_s > 8  # epoch times alone: 104 %
    assert eight.efficiency == pytest.approx(1.0)
