"""Communication hooks (landcover.comm.hooks, with spec, meter, onebit and powersgd) at the hook
level, in a 2-process gloo group.

One spawned group (module fixture) runs every scenario and saves what each rank saw; the tests
below assert on those results.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from landcover.comm.counts import CommCounts
from landcover.comm.hooks import install_comm_hook
from landcover.comm.meter import CommMeter
from landcover.comm.onebit import pack_bits, unpack_bits
from landcover.comm.spec import CompressionSpec, parse_compression
from landcover.errors import TrainingError
from tests.landcover.comm.ranks import (
    WORLD_SIZE,
    flat_params,
    round_trip,
    run_on_two_ranks,
    sgd,
    toy_model,
    toy_step,
)

STEPS = 6  # past PowerSGD's start (2) and DDP's bucket rebuild (after step 1)
MODES = ["none", "fp16", "bf16", "powersgd:2", "onebit"]
RESUMED_MODES = ["onebit", "powersgd:2"]
BUCKET_CAP_MB = 0.04  # ~10k floats per bucket: the toy model's 42k parameters make 3 buckets


# -- what every rank runs -----------------------------------------------------------------------


def ddp_setup(
    spec: CompressionSpec, checkpoint: dict[str, Any] | None = None
) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, CommMeter]:
    model = toy_model()
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    meter = install_comm_hook(ddp, spec)
    optimizer = sgd(model)
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        meter.load_state_dict(checkpoint["comm"])
    return model, ddp, optimizer, meter


def run_ddp_modes(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in MODES:
        spec = parse_compression(label)
        model, ddp, optimizer, meter = ddp_setup(spec)
        snapshots, step_bytes, step_calls = [], [], []
        for step in range(STEPS):
            before = meter.bytes_sent
            calls_before, buckets_before = dict(meter.calls), meter.buckets
            toy_step(ddp, optimizer, rank, step)
            step_bytes.append(meter.bytes_sent - before)
            step_calls.append(
                {
                    **{kind: meter.calls[kind] - calls_before[kind] for kind in meter.calls},
                    "buckets": meter.buckets - buckets_before,
                }
            )
            snapshots.append(flat_params(model))
            if step == 2:
                checkpoint = round_trip(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "comm": meter.state_dict(),
                    }
                )
        logging_data = ddp._get_ddp_logging_data()  # type: ignore[operator]
        out[label] = {
            "params": torch.stack(snapshots),
            "step_bytes": step_bytes,
            "step_calls": step_calls,
            "counts": dataclasses.asdict(meter.counts_per_step()),
            "steps": meter.steps,
            "bytes_per_step": meter.bytes_per_step(),
            "comm_time_s": meter.comm_time_s,
            "initial_buckets": len(str(logging_data.get("bucket_sizes", "")).split(",")),
            "rebuilt_buckets": len(str(logging_data.get("rebuilt_bucket_sizes", "")).split(",")),
        }
        if label in RESUMED_MODES:
            model, ddp, optimizer, meter = ddp_setup(spec, checkpoint)
            for step in range(3, STEPS):
                toy_step(ddp, optimizer, rank, step)
            out[label]["resumed_params"] = flat_params(model)
    out["shapes"] = [list(p.shape) for p in toy_model().parameters()]
    return out


def run_error_feedback(rank: int) -> dict[str, Any]:
    """Least squares where each rank's data has its own optimum (heterogeneous workers).

    Scaled sign without error feedback stalls once the ranks' gradient signs disagree (the
    compressed average is then 0 in that coordinate) short of the joint optimum; error
    feedback carries the lost part over and converges.
    """
    features = 16
    g = torch.Generator().manual_seed(7)
    w_true = torch.randn(features, generator=g)
    shift = torch.randn(features, generator=g)
    g = torch.Generator().manual_seed(100 + rank)
    a = torch.randn(128, features, generator=g)
    y = a @ (w_true + (1.0 if rank else -1.0) * shift)
    all_a = [torch.zeros_like(a) for _ in range(WORLD_SIZE)]
    all_y = [torch.zeros_like(y) for _ in range(WORLD_SIZE)]
    dist.all_gather(all_a, a)
    dist.all_gather(all_y, y)
    w_opt = torch.linalg.lstsq(torch.cat(all_a), torch.cat(all_y).unsqueeze(1)).solution
    loss_opt = float(((torch.cat(all_a) @ w_opt).squeeze(1) - torch.cat(all_y)).pow(2).mean())
    out: dict[str, Any] = {}
    for spec in (CompressionSpec("onebit"), CompressionSpec("onebit", error_feedback=False)):
        model = nn.Linear(features, 1, bias=False)
        nn.init.zeros_(model.weight)
        ddp = nn.parallel.DistributedDataParallel(model)
        install_comm_hook(ddp, spec)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
        losses = []
        for _ in range(200):
            optimizer.zero_grad()
            loss = (ddp(a).squeeze(1) - y).pow(2).mean()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            losses.append(float(loss))
        curve = torch.tensor(losses)
        dist.all_reduce(curve)
        out[str(spec)] = (curve / WORLD_SIZE - loss_opt).tolist()
    return out


def run_all_scenarios(rank: int) -> dict[str, Any]:
    return {"ddp": run_ddp_modes(rank), "ef": run_error_feedback(rank)}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_two_ranks(run_all_scenarios, tmp_path_factory.mktemp("comm"))


# -- DDP hooks ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_ranks_hold_identical_parameters_after_every_step(
    ranks: list[dict[str, Any]], mode: str
) -> None:
    first, second = ranks[0]["ddp"][mode]["params"], ranks[1]["ddp"][mode]["params"]
    assert first.shape[0] == STEPS
    assert torch.equal(first, second)
    # and training moved them: every step changed the parameters
    assert all(not torch.equal(first[i], first[i + 1]) for i in range(STEPS - 1))


@pytest.mark.slow
def test_scenario_covers_bucket_rebuild(ranks: list[dict[str, Any]]) -> None:
    # DDP starts with one bucket and rebuilds into several after the first step, so the
    # per-bucket state above really went through a layout change.
    result = ranks[0]["ddp"]["onebit"]
    assert result["initial_buckets"] == 1
    assert result["rebuilt_buckets"] >= 3


@pytest.mark.slow
def test_hooks_measure_the_bytes_they_send(ranks: list[dict[str, Any]]) -> None:
    ddp = ranks[0]["ddp"]
    numel = sum(math.prod(shape) for shape in ddp["shapes"])
    assert ddp["none"]["step_bytes"] == [4 * numel] * STEPS
    assert ddp["fp16"]["step_bytes"] == [2 * numel] * STEPS
    assert ddp["bf16"]["step_bytes"] == [2 * numel] * STEPS
    for mode in MODES:
        assert ddp[mode]["steps"] == STEPS
        assert ddp[mode]["comm_time_s"] > 0
        assert ddp[mode]["bytes_per_step"] == sum(ddp[mode]["step_bytes"]) / STEPS


@pytest.mark.slow
def test_onebit_sends_at_most_a_25th_of_fp32(ranks: list[dict[str, Any]]) -> None:
    ddp = ranks[0]["ddp"]
    onebit, full = ddp["onebit"]["step_bytes"], ddp["none"]["step_bytes"]
    assert all(0 < sent * 25 <= fp32 for sent, fp32 in zip(onebit, full, strict=True))


def powersgd_bytes(shapes: list[list[int]], rank: int) -> int:
    """torch's PowerSGD rules: a tensor viewed as (rows, cols) with r = min(rows, cols, rank)
    is compressed (P and Q: (rows + cols) * r values) only if that is under half its size;
    1-D tensors never qualify. Everything goes as fp32."""
    total = 0
    for shape in shapes:
        rows = shape[0]
        cols = math.prod(shape) // rows
        r = min(rows, cols, rank)
        compressed = (rows + cols) * r
        total += compressed if compressed * 2 < rows * cols else rows * cols
    return 4 * total


@pytest.mark.slow
def test_powersgd_compresses_by_the_expected_ratio(ranks: list[dict[str, Any]]) -> None:
    ddp = ranks[0]["ddp"]
    numel = sum(math.prod(shape) for shape in ddp["shapes"])
    expected = powersgd_bytes(ddp["shapes"], rank=2)
    assert expected < 4 * numel / 10  # the toy model is worth compressing
    # plain all-reduce before start_iter (2), then exactly P, Q and the uncompressed rest
    assert ddp["powersgd:2"]["step_bytes"] == [4 * numel] * 2 + [expected] * (STEPS - 2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", RESUMED_MODES)
def test_comm_state_checkpoint_resume_reproduces(ranks: list[dict[str, Any]], mode: str) -> None:
    # Resumed at step 3 into a fresh DDP (whose buckets start in the initial layout again).
    for rank in ranks:
        result = rank["ddp"][mode]
        assert torch.equal(result["resumed_params"], result["params"][-1])


@pytest.mark.slow
def test_onebit_error_feedback_converges_where_plain_sign_stalls(
    ranks: list[dict[str, Any]],
) -> None:
    with_ef, without_ef = ranks[0]["ef"]["onebit"], ranks[0]["ef"]["onebit-no-ef"]
    assert with_ef[0] == without_ef[0] > 1.0  # the same start, far from the optimum
    assert with_ef[-1] < 0.01 * with_ef[0]
    assert without_ef[-1] >= with_ef[-1]


# -- single process -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", CompressionSpec("none")),
        ("fp16", CompressionSpec("fp16")),
        ("BF16", CompressionSpec("bf16")),
        ("powersgd", CompressionSpec("powersgd", rank=2)),
        ("powersgd:4", CompressionSpec("powersgd", rank=4)),
        (" onebit ", CompressionSpec("onebit")),
    ],
)
def test_parse_compression(text: str, expected: CompressionSpec) -> None:
    spec = parse_compression(text)
    assert spec == expected
    assert parse_compression(str(spec)) == spec


@pytest.mark.parametrize("text", ["", "fp8", "powersgd:0", "powersgd:x", "powersgd:", "onebit:2"])
def test_parse_compression_rejects_bad_text(text: str) -> None:
    with pytest.raises(TrainingError) as info:
        parse_compression(text)
    assert str(info.value) == (
        f"--compression {text!r} is not valid; use one of: "
        "none, fp16, bf16, powersgd[:RANK] (e.g. powersgd:4), onebit"
    )


def test_compression_spec_checks_powersgd_settings() -> None:
    assert str(CompressionSpec("powersgd", rank=3)) == "powersgd:3"
    with pytest.raises(TrainingError, match="start_iter 1 must be >= 2"):
        CompressionSpec("powersgd", start_iter=1)
    with pytest.raises(TrainingError, match="rank 0 must be a positive integer"):
        CompressionSpec("powersgd", rank=0)


def test_install_comm_hook_needs_ddp() -> None:
    with pytest.raises(TrainingError, match="needs a DistributedDataParallel model, got Linear"):
        install_comm_hook(nn.Linear(2, 2), CompressionSpec())


@pytest.mark.parametrize("count", [1, 7, 8, 9, 1001])
def test_bits_pack_eight_per_byte_and_unpack(count: int) -> None:
    bits = torch.rand(count, generator=torch.Generator().manual_seed(count)) > 0.5
    packed = pack_bits(bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == -(-count // 8)
    assert torch.equal(unpack_bits(packed, count), bits)


def test_meter_counts_overlapping_intervals_once() -> None:
    meter = CommMeter()
    assert meter.bytes_per_step() == 0.0
    assert meter.time_per_step_s() == 0.0
    meter.add_interval(10.0, 12.0)
    meter.add_interval(11.0, 13.0)  # overlaps the first
    meter.add_interval(15.0, 16.0)
    meter.add_step()
    meter.add_step()
    meter.add_bytes(100)
    assert meter.comm_time_s == pytest.approx(4.0)
    assert meter.time_per_step_s() == pytest.approx(2.0)
    assert meter.bytes_per_step() == 50.0
    meter.reset()
    assert (meter.bytes_sent, meter.steps, meter.comm_time_s) == (0, 0, 0.0)


@pytest.mark.slow
def test_meter_counts_the_collectives_each_mode_issues_per_bucket(
    ranks: list[dict[str, Any]],
) -> None:
    ddp = ranks[0]["ddp"]
    for mode in ("none", "fp16", "bf16"):  # one all-reduce per bucket
        for step in ddp[mode]["step_calls"]:
            assert step == {
                "all_reduce": step["buckets"],
                "all_gather": 0,
                "broadcast": 0,
                "buckets": step["buckets"],
            }
    for step in ddp["onebit"]["step_calls"]:  # one all-gather of its payload per bucket
        assert (step["all_reduce"], step["all_gather"]) == (0, step["buckets"])
    rounds = [s["all_reduce"] / s["buckets"] for s in ddp["powersgd:2"]["step_calls"]]
    # plain all-reduce before start_iter (2), then the uncompressed tensors, P and Q
    assert rounds == [1, 1] + [3] * (STEPS - 2)
    assert ddp["none"]["step_calls"][-1]["buckets"] >= 3  # the rebuilt buckets
    for mode in MODES:
        counts = CommCounts(**ddp[mode]["counts"])
        assert counts.measured
        assert counts.bytes_per_step == pytest.approx(ddp[mode]["bytes_per_step"])
        calls = sum(
            sum(s[k] for k in ("all_reduce", "all_gather")) for s in ddp[mode]["step_calls"]
        )
        assert counts.collectives_per_step == pytest.approx(calls / STEPS)


def test_meter_counts_collectives_by_kind_and_keeps_them_in_its_state() -> None:
    meter = CommMeter("onebit")
    meter.add_collective("all_gather", 300)
    meter.add_collective("all_reduce", 100)
    meter.add_collective("all_reduce", 100)
    meter.add_bucket()
    meter.add_bucket()
    meter.add_step()
    meter.add_step()
    counts = meter.counts_per_step()
    assert (counts.allreduce_per_step, counts.allreduce_bytes_per_step) == (1.0, 100.0)
    assert (counts.allgather_per_step, counts.allgather_bytes_per_step) == (0.5, 150.0)
    assert (counts.broadcast_per_step, counts.buckets_per_step) == (0.0, 1.0)
    assert meter.bytes_per_step() == counts.bytes_per_step == 250.0
    resumed = CommMeter("onebit")
    resumed.load_state_dict(meter.state_dict())
    assert resumed.counts_per_step() == counts
    # a checkpoint from before the counts by kind: bytes kept, counts restart at zero
    old = {k: v for k, v in meter.state_dict().items() if k not in ("calls", "bytes_by_kind")}
    resumed.load_state_dict(old)
    assert resumed.bytes_sent == 500 and resumed.calls["all_gather"] == 0
    meter.reset()
    assert meter.counts_per_step() == CommCounts()


def test_meter_ignores_state_of_another_compression(caplog: pytest.LogCaptureFixture) -> None:
    saved = CommMeter("onebit")
    saved.add_bytes(7)
    meter = CommMeter("powersgd:2")
    with caplog.at_level(logging.WARNING, logger="landcover.comm.meter"):
        meter.load_state_dict(saved.state_dict())
    assert meter.bytes_sent == 0
    assert "checkpoint communication state is for onebit, this run uses powersgd:2" in caplog.text
