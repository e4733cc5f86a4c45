"""Communication hooks (landcover.comm.hooks) and block momentum (landcover.comm.bmuf), at the
hook level,
in a 2-process gloo group.

One spawned group (module fixture) runs every scenario and saves what each rank saw; the tests
below assert on those results. Multi-process work is costly on 2 cores (torch import and DDP
set-up take seconds), so the scenarios share the group.
"""

from __future__ import annotations

import datetime
import io
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from landcover.comm.bmuf import BlockMomentum, ResettableAdamW, reset_local_momentum
from landcover.comm.hooks import (
    CommMeter,
    CompressionSpec,
    _pack_bits,
    _unpack_bits,
    install_comm_hook,
    parse_compression,
)
from landcover.errors import TrainingError

WORLD_SIZE = 2
STEPS = 6  # past PowerSGD's start (2) and DDP's bucket rebuild (after step 1)
MODES = ["none", "fp16", "bf16", "powersgd:2", "onebit"]
RESUMED_MODES = ["onebit", "powersgd:2"]
BUCKET_CAP_MB = 0.04  # ~10k floats per bucket: the toy model's 42k parameters make 3 buckets
SPAWN_TIMEOUT_S = 240


# -- what every rank runs -----------------------------------------------------------------------


def toy_model() -> nn.Module:
    """~42k parameters, with BatchNorm (buffers) and 1-D biases PowerSGD leaves uncompressed."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(4, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 5, 1),
    )


def toy_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    """One optimizer step on this rank's own batch (different data on every rank)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(4, 4, 11, 13, generator=g)
    y = torch.randint(0, 5, (4, 11, 13), generator=g)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def flat_state(model: nn.Module) -> torch.Tensor:
    tensors = [p.detach().reshape(-1) for p in model.parameters()]
    tensors += [b.detach().reshape(-1) for b in model.buffers() if b.is_floating_point()]
    return torch.cat(tensors).clone()


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """Through bytes, as a checkpoint goes: must load with weights_only=True."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


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
        snapshots, step_bytes = [], []
        for step in range(STEPS):
            before = meter.bytes_sent
            toy_step(ddp, optimizer, rank, step)
            step_bytes.append(meter.bytes_sent - before)
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


def average_model(model: nn.Module) -> None:
    """The manual reference for periodic model averaging."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                dist.all_reduce(tensor)
                tensor.div_(WORLD_SIZE)


class ReferenceBlockMomentum:
    """BMUF written independently, per tensor, from the paper's equations (Chen & Huo 2016,
    NBM): G from the block's start, Δ = η·Δ + ζ·G, W = W + Δ, restart from W + η·Δ."""

    def __init__(self, model: nn.Module, eta: float, zeta: float) -> None:
        self.model, self.eta, self.zeta = model, eta, zeta
        self.w_global = [p.detach().clone() for p in model.parameters()]
        self.delta = [torch.zeros_like(p) for p in model.parameters()]

    def block_end(self) -> None:
        with torch.no_grad():
            for p, w, d in zip(self.model.parameters(), self.w_global, self.delta, strict=True):
                mean = p.detach().clone()
                dist.all_reduce(mean)
                mean /= WORLD_SIZE
                start = w + self.eta * d  # where the workers began this block
                d.copy_(self.eta * d + self.zeta * (mean - start))
                w.add_(d)
                p.copy_(w + self.eta * d)
            for b in self.model.buffers():
                if b.is_floating_point():
                    dist.all_reduce(b)
                    b.div_(WORLD_SIZE)


def run_block_momentum(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # 1. eta = 0, zeta = 1 against plain periodic averaging.
    model_a, model_b = toy_model(), toy_model()
    opt_a, opt_b = sgd(model_a), sgd(model_b)
    bmuf = BlockMomentum(model_a, block_size=3, momentum=0.0, block_lr=1.0)
    synced, diffs, snapshots = [], [], []
    for step in range(8):
        toy_step(model_a, opt_a, rank, step)
        synced.append(bmuf.after_optimizer_step())
        toy_step(model_b, opt_b, rank, step)
        if (step + 1) % 3 == 0:
            average_model(model_b)
        diffs.append(float((flat_state(model_a) - flat_state(model_b)).abs().max()))
        snapshots.append(flat_state(model_a))
    buffer_numel = sum(b.numel() for b in model_a.buffers() if b.is_floating_point())
    out["averaging"] = {
        "synced": synced,
        "max_diff": diffs,
        "states": torch.stack(snapshots),
        "bytes_sent": bmuf.meter.bytes_sent,
        "steps": bmuf.meter.steps,
        "numel": sum(p.numel() for p in model_a.parameters()) + buffer_numel,
        "comm_time_s": bmuf.meter.comm_time_s,
    }
    # 2. General eta, zeta with Nesterov against the reference.
    model_a, model_b = toy_model(), toy_model()
    opt_a, opt_b = sgd(model_a), sgd(model_b)
    bmuf = BlockMomentum(model_a, block_size=2, momentum=0.6, block_lr=1.3, nesterov=True)
    reference = ReferenceBlockMomentum(model_b, eta=0.6, zeta=1.3)
    diffs = []
    for step in range(6):
        toy_step(model_a, opt_a, rank, step)
        bmuf.after_optimizer_step()
        toy_step(model_b, opt_b, rank, step)
        if (step + 1) % 2 == 0:
            reference.block_end()
        diffs.append(float((flat_state(model_a) - flat_state(model_b)).abs().max()))
    out["momentum_vs_reference"] = diffs
    # 3. Default momentum (1 - 1/N); checkpoint mid-block (step 4 of blocks of 3), resume.
    # The uninterrupted run also looks at the global model mid-block (steps 3 and 4), as the
    # trainer does to validate and save; the resumed run never does.
    model = toy_model()
    optimizer = sgd(model)
    bmuf = BlockMomentum(model, block_size=3)
    out["default_momentum"] = bmuf.momentum
    for step in range(8):
        toy_step(model, optimizer, rank, step)
        bmuf.after_optimizer_step()
        if step in (3, 4):
            local = flat_state(model)
            with bmuf.global_model():
                out["global_model"] = flat_state(model)
            out["global_state"] = torch.cat([bmuf.global_params, bmuf.global_buffers])
            out["local_state"] = local
            out["local_restored"] = torch.equal(flat_state(model), local)
        if step == 3:
            checkpoint = round_trip(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "bmuf": bmuf.state_dict(),
                }
            )
    out["continuous"] = flat_state(model)
    model = toy_model()
    model.load_state_dict(checkpoint["model"])
    optimizer = sgd(model)
    optimizer.load_state_dict(checkpoint["optimizer"])
    bmuf = BlockMomentum(model, block_size=3)
    bmuf.load_state_dict(checkpoint["bmuf"])
    for step in range(4, 8):
        toy_step(model, optimizer, rank, step)
        bmuf.after_optimizer_step()
    out["resumed"] = flat_state(model)
    # 4. A partial block (step 4 of blocks of 3) closed by end_block(), as at an epoch end.
    model = toy_model()
    optimizer = sgd(model)
    bmuf = BlockMomentum(model, block_size=3, momentum=0.0)
    for step in range(4):
        toy_step(model, optimizer, rank, step)
        bmuf.after_optimizer_step()
    local = flat_state(model)
    merged = bmuf.end_block()
    out["partial"] = {
        "local": local,
        "merged": merged,
        "again": bmuf.end_block(),
        "model": flat_state(model),
        "global": torch.cat([bmuf.global_params, bmuf.global_buffers]),
        "bytes_sent": bmuf.meter.bytes_sent,
        "block_steps": bmuf.block_steps,
    }
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
    return {
        "ddp": run_ddp_modes(rank),
        "bmuf": run_block_momentum(rank),
        "ef": run_error_feedback(rank),
    }


def rank_entry(rank: int, worker: Callable[[int], Any], port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60)
    )
    result = worker(rank)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # After DDP, interpreter teardown takes ~5 s per process (measured); the results are saved.
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_on_two_ranks(worker: Callable[[int], Any], out_dir: Path) -> list[dict[str, Any]]:
    context = mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
        rank_entry, args=(worker, free_port(), str(out_dir)), nprocs=WORLD_SIZE, join=False
    )
    assert context is not None
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"2-rank gloo scenarios did not finish in {SPAWN_TIMEOUT_S} s")
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]


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


# -- block momentum -----------------------------------------------------------------------------


@pytest.mark.slow
def test_bmuf_without_momentum_is_periodic_averaging(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        result = rank["bmuf"]["averaging"]
        assert result["synced"] == [False, False, True] * 2 + [False, False]
        assert max(result["max_diff"]) < 1e-5
    states = [rank["bmuf"]["averaging"]["states"] for rank in ranks]
    for step in (2, 5):  # block ends: all ranks hold the average
        assert torch.equal(states[0][step], states[1][step])
    assert not torch.equal(states[0][0], states[1][0])  # mid-block: local models differ


@pytest.mark.slow
def test_bmuf_momentum_matches_reference(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert max(rank["bmuf"]["momentum_vs_reference"]) < 1e-5
        assert rank["bmuf"]["default_momentum"] == 1 - 1 / WORLD_SIZE


@pytest.mark.slow
def test_bmuf_meter_counts_model_average_bytes(ranks: list[dict[str, Any]]) -> None:
    result = ranks[0]["bmuf"]["averaging"]
    assert result["steps"] == 8
    assert result["bytes_sent"] == 2 * 4 * result["numel"]  # two block ends, params + stats
    assert result["comm_time_s"] > 0


@pytest.mark.slow
def test_bmuf_state_dict_round_trip_mid_block_reproduces(ranks: list[dict[str, Any]]) -> None:
    # ... although the uninterrupted run swapped the global model in and out mid-block.
    for rank in ranks:
        assert torch.equal(rank["bmuf"]["resumed"], rank["bmuf"]["continuous"])


@pytest.mark.slow
def test_bmuf_global_model_mid_block_is_the_same_on_every_rank(
    ranks: list[dict[str, Any]],
) -> None:
    first, second = ranks[0]["bmuf"], ranks[1]["bmuf"]
    assert not torch.equal(first["local_state"], second["local_state"])  # mid-block
    assert torch.equal(first["global_model"], second["global_model"])
    for rank in (first, second):
        assert torch.equal(rank["global_model"], rank["global_state"])
        assert rank["local_restored"]


@pytest.mark.slow
def test_bmuf_end_block_merges_a_partial_block(ranks: list[dict[str, Any]]) -> None:
    """4 steps in blocks of 3, then end_block(): the 4th step's local progress reaches the
    global model (η = 0: the plain average of the learners), every rank holds it, and a second
    end_block() with no step in between sends nothing."""
    first, second = ranks[0]["bmuf"]["partial"], ranks[1]["bmuf"]["partial"]
    assert not torch.equal(first["local"], second["local"])
    average = (first["local"] + second["local"]) / 2
    numel = ranks[0]["bmuf"]["averaging"]["numel"]
    for rank in (first, second):
        assert rank["merged"] and not rank["again"] and rank["block_steps"] == 0
        torch.testing.assert_close(rank["global"], average, rtol=0, atol=1e-6)
        assert torch.equal(rank["model"], rank["global"])
        assert rank["bytes_sent"] == 2 * 4 * numel  # the block end at step 3, the merge


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
    packed = _pack_bits(bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == -(-count // 8)
    assert torch.equal(_unpack_bits(packed, count), bits)


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


def test_meter_ignores_state_of_another_compression(caplog: pytest.LogCaptureFixture) -> None:
    saved = CommMeter("onebit")
    saved.add_bytes(7)
    meter = CommMeter("powersgd:2")
    with caplog.at_level(logging.WARNING, logger="landcover.comm.hooks"):
        meter.load_state_dict(saved.state_dict())
    assert meter.bytes_sent == 0
    assert "checkpoint communication state is for onebit, this run uses powersgd:2" in caplog.text


def test_block_momentum_checks_its_settings() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(TrainingError, match="--block-size 0 must be >= 1"):
        BlockMomentum(model, block_size=0)
    with pytest.raises(TrainingError, match=r"block momentum 1.0 must be in \[0, 1\)"):
        BlockMomentum(model, block_size=2, momentum=1.0)
    with pytest.raises(TrainingError, match=r"block learning rate 0\.0 must be > 0"):
        BlockMomentum(model, block_size=2, block_lr=0.0)
    bmuf = BlockMomentum(model, block_size=2)
    other = BlockMomentum(nn.Linear(3, 3), block_size=2)
    with pytest.raises(TrainingError, match="holds 12 parameters, the model 8"):
        bmuf.load_state_dict(other.state_dict())


def test_global_model_swaps_in_the_last_block_end_and_restores_local_weights() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bmuf = BlockMomentum(model, block_size=2)
    states = []
    for _ in range(3):  # a block end after step 2, then one step into the next block
        optimizer.zero_grad()
        model(torch.randn(5, 3)).square().sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        bmuf.after_optimizer_step()
        states.append(flat_state(model))
    assert not torch.equal(states[1], states[2])
    with bmuf.global_model():
        assert torch.equal(flat_state(model), states[1])  # N = 1: W_global is the local model
    assert torch.equal(flat_state(model), states[2])


def test_block_momentum_on_one_worker_keeps_local_training() -> None:
    # N = 1: default momentum 0, the "average" is the local model: nothing changes.
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bmuf = BlockMomentum(model, block_size=2)
    assert bmuf.momentum == 0.0
    synced = []
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.ones(1, 3)).sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        before = flat_params(model)
        synced.append(bmuf.after_optimizer_step())
        torch.testing.assert_close(flat_params(model), before)
    assert synced == [False, True, False, True]
    assert bmuf.meter.bytes_sent == 0


@pytest.mark.parametrize("name", ["sgd", "adamw", "sgd-no-momentum"])
def test_reset_local_momentum_zeroes_the_first_moment_only(name: str) -> None:
    """SGD's momentum buffer and Adam's first moment are zeroed in place, with the first
    moment's own bias-correction count; Adam's second moment (a scale, whose bias correction
    assumes it was never reset) and step count stay."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer: torch.optim.Optimizer = {
        "sgd": lambda: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
        "adamw": lambda: ResettableAdamW(model.parameters(), lr=0.1),
        "sgd-no-momentum": lambda: torch.optim.SGD(model.parameters(), lr=0.1),
    }[name]()
    assert reset_local_momentum(optimizer) == 0  # no state before the first step
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).square().sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    before = {
        (id(p), key): value.clone()
        for p, state in optimizer.state.items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }
    zeroed = reset_local_momentum(optimizer)
    assert zeroed == {"sgd": 2, "adamw": 2, "sgd-no-momentum": 0}[name]
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key in ("momentum_buffer", "exp_avg"):
                assert before[(id(p), key)].abs().sum() > 0 and not value.any(), key
            else:
                assert torch.equal(value, before[(id(p), key)]), key
        if name == "adamw":
            assert (state["step"], state["exp_avg_step"]) == (2, 0)


def constant_gradient_steps(
    optimizer_for: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    *,
    before: int,
    after: int,
    reset: Callable[[torch.optim.Optimizer], object],
) -> list[float]:
    """Sizes of the `after` steps that follow a momentum reset after `before` steps, on
    w · c with a constant gradient c: Adam's nominal step is then lr in every coordinate."""
    weight = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = optimizer_for([weight])
    c = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    sizes = []
    for step in range(before + after):
        if step == before:
            reset(optimizer)
        previous = weight.detach().clone()
        optimizer.zero_grad()
        (weight * c).sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        sizes.append(float((weight.detach() - previous).abs().max()))
    return sizes[before:]


def zero_first_moment(optimizer: torch.optim.Optimizer) -> None:
    """What reset_local_momentum did to torch's AdamW before ResettableAdamW."""
    for state in optimizer.state.values():
        state["exp_avg"].zero_()


def test_the_local_steps_after_a_block_end_keep_their_nominal_size() -> None:
    """After 20 steps and a first-moment reset (a block end), every AdamW step of the next
    block of 8 is lr, as before the reset. Zeroing torch AdamW's first moment (after 100
    steps) made the k-th 1 - 0.9^k of it: a tenth for the first, 36 % on average over 8."""
    lr = 0.01

    def resettable(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return ResettableAdamW(params, lr=lr, weight_decay=0.0)

    def torch_adamw(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    sizes = constant_gradient_steps(resettable, before=20, after=8, reset=reset_local_momentum)
    assert sizes == pytest.approx([lr] * 8, rel=1e-6)
    shrunk = constant_gradient_steps(torch_adamw, before=100, after=8, reset=zero_first_moment)
    expected = [(1 - 0.9**k) / (1 - 0.9 ** (100 + k)) * lr for k in range(1, 9)]
    assert shrunk == pytest.approx(expected, rel=1e-6)
    assert shrunk[0] == pytest.approx(0.1 * lr, rel=1e-3)
    assert sum(shrunk) / 8 == pytest.approx(0.36 * lr, rel=0.01)
    with pytest.raises(TrainingError, match="AdamW bias-corrects its first moment with the step"):
        constant_gradient_steps(torch_adamw, before=2, after=1, reset=reset_local_momentum)


def test_resettable_adamw_takes_torch_adamw_steps_until_a_reset() -> None:
    models = [toy_model(), toy_model()]
    optimizers = [
        ResettableAdamW(models[0].parameters(), lr=0.01, weight_decay=0.05),
        torch.optim.AdamW(models[1].parameters(), lr=0.01, weight_decay=0.05),
    ]
    for step in range(5):
        for model, optimizer in zip(models, optimizers, strict=True):
            toy_step(model, optimizer, 0, step)
    torch.testing.assert_close(flat_params(models[0]), flat_params(models[1]))
    # A checkpoint of torch's AdamW continues in ResettableAdamW (the first moment's count is
    # the step count), and its own state round-trips through weights_only loading.
    state = round_trip(optimizers[1].state_dict())
    resumed = ResettableAdamW(models[1].parameters(), lr=0.01, weight_decay=0.05)
    resumed.load_state_dict(state)
    toy_step(models[1], resumed, 0, 5)
    toy_step(models[0], optimizers[0], 0, 5)
    torch.testing.assert_close(flat_params(models[0]), flat_params(models[1]))
    assert round_trip(resumed.state_dict())["state"][0]["exp_avg_step"] == 6
