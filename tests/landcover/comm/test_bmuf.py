"""Block momentum (landcover.comm.bmuf): in a 2-process gloo group against plain periodic
averaging and an independent reference, and on a single process (its settings, the global
model, the local momentum reset and ResettableAdamW).

One spawned group (module fixture) runs every scenario and saves what each rank saw; the tests
below assert on those results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from landcover.comm.bmuf import BlockMomentum, ResettableAdamW, reset_local_momentum
from landcover.errors import TrainingError
from tests.landcover.comm.ranks import (
    WORLD_SIZE,
    flat_params,
    flat_state,
    round_trip,
    run_on_two_ranks,
    sgd,
    toy_model,
    toy_step,
)

# -- what every rank runs -----------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_two_ranks(run_block_momentum, tmp_path_factory.mktemp("bmuf"))


# -- block momentum -----------------------------------------------------------------------------


@pytest.mark.slow
def test_bmuf_without_momentum_is_periodic_averaging(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        result = rank["averaging"]
        assert result["synced"] == [False, False, True] * 2 + [False, False]
        assert max(result["max_diff"]) < 1e-5
    states = [rank["averaging"]["states"] for rank in ranks]
    for step in (2, 5):  # block ends: all ranks hold the average
        assert torch.equal(states[0][step], states[1][step])
    assert not torch.equal(states[0][0], states[1][0])  # mid-block: local models differ


@pytest.mark.slow
def test_bmuf_momentum_matches_reference(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert max(rank["momentum_vs_reference"]) < 1e-5
        assert rank["default_momentum"] == 1 - 1 / WORLD_SIZE


@pytest.mark.slow
def test_bmuf_meter_counts_model_average_bytes(ranks: list[dict[str, Any]]) -> None:
    result = ranks[0]["averaging"]
    assert result["steps"] == 8
    assert result["bytes_sent"] == 2 * 4 * result["numel"]  # two block ends, params + stats
    assert result["comm_time_s"] > 0


@pytest.mark.slow
def test_bmuf_state_dict_round_trip_mid_block_reproduces(ranks: list[dict[str, Any]]) -> None:
    # ... although the uninterrupted run swapped the global model in and out mid-block.
    for rank in ranks:
        assert torch.equal(rank["resumed"], rank["continuous"])


@pytest.mark.slow
def test_bmuf_global_model_mid_block_is_the_same_on_every_rank(
    ranks: list[dict[str, Any]],
) -> None:
    first, second = ranks[0], ranks[1]
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
    first, second = ranks[0]["partial"], ranks[1]["partial"]
    assert not torch.equal(first["local"], second["local"])
    average = (first["local"] + second["local"]) / 2
    numel = ranks[0]["averaging"]["numel"]
    for rank in (first, second):
        assert rank["merged"] and not rank["again"] and rank["block_steps"] == 0
        torch.testing.assert_close(rank["global"], average, rtol=0, atol=1e-6)
        assert torch.equal(rank["model"], rank["global"])
        assert rank["bytes_sent"] == 2 * 4 * numel  # the block end at step 3, the merge


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
