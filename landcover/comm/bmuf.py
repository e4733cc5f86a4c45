"""Block momentum (BMUF): local optimizer steps, then a block-level model average with momentum.

Block momentum (`BlockMomentum`, Chen & Huo 2016, CNTK's BMUF) replaces the gradient
all-reduce: every worker takes `block_size` local optimizer steps, then the workers average
their models. With S the model every worker started the block from and G = mean_i(W_i) - S:
    Δ = η·Δ + ζ·G,    W_global = W_global + Δ
with block momentum η (default 1 - 1/N) and block learning rate ζ (default 1). Nesterov form:
the paper's NBM variant, Sutskever's Nesterov momentum at block level. After the update every
worker restarts from the look-ahead S = W_global + η·Δ instead of S = W_global, and G is taken
from S (where the learners really started, as CNTK takes it from its `prevWeight`). Under
steady progress p per block, Δ settles at ζ·p/(1 - η) and so does the block step of W_global
and of S: with the default η that is N times the averaged progress, the part linear lr scaling
plays for DDP. Two near misses, both tested: taking G from W_global counts η·Δ twice and Δ
grows without bound; adding Δ to S instead of W_global (W_global = S + Δ) makes the steady
step (1 + η)/(1 - η)·p, 3p rather than 2p at 2 workers, about 2N at large N (CNTK avoids that
overshoot only by scaling G by 1 - η, which the issue's update rule does not have). We chose
this form because it needs no state beyond Δ and W_global, it is the paper's, and with η = 0
it reduces exactly to periodic model averaging whatever `nesterov` says. BatchNorm running
statistics (float buffers) are averaged at each block boundary, without momentum.

Blocks end every `block_size` local steps and at `end_block()`, which the trainer calls at the
end of every epoch: a partial last block is merged into the global model like a full one (its
G is just smaller), so validation, `model.pt`, the checkpoint and the end of training see every
local step, and every epoch starts a fresh block (11 steps in blocks of 4 make blocks of 4, 4
and 3). We chose epoch ends over merging only when someone looks (before validation or a
save): the trainer looks after every epoch anyway, and a run then never ends with local
progress left out of its model. A checkpoint, always taken at an epoch end, therefore finds
every learner at the same model; only their optimizer states differ.

The local optimizer's momentum (SGD's buffer, Adam's first moment) is zeroed after every block
end by default (`reset_local_momentum`, CNTK's `reset_sgd_momentum_after_aggregation`): it
points where this worker's own model was heading, the block update has moved every model
somewhere else, and the block momentum already carries the direction. Adam divides its first
moment by 1 - β1^t, t its step count, to make up for the zero it started from; after a reset
at step T torch's AdamW would divide by 1 - β1^(T+k) ≈ 1 instead of 1 - β1^k, and the k-th
local step after a block end would be 1 - β1^k of its nominal size (a tenth for the first one,
36 % on average over a block of 8). So the trainer's AdamW under BMUF is `ResettableAdamW`,
whose first moment keeps its own count, restarted with it; the second moment, a
per-coordinate scale, is never reset. How the reset compares with keeping the momentum is
measured over seeds by `benchmarks/bench_comm.py --seeds N`; the trainer's
`--keep-local-momentum` keeps it.

`BlockMomentum.state_dict()` holds this rank's Δ, W_global, the BatchNorm statistics of the
last block end and the position in the block; resuming mid-block also needs each rank's own
local model and optimizer state (they differ between ranks until the block ends).
Validation and saving use the block-level global model: inside `with bmuf.global_model():`
the model holds W_global and the BatchNorm statistics averaged at the last block end (the
same on every rank), and on exit each rank gets its local weights back, bit for bit, so
looking at the global model never changes training.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from landcover.comm.meter import CommMeter, CountingCollectives
from landcover.errors import TrainingError

logger = logging.getLogger(__name__)


class BlockMomentum:
    """BMUF: local optimizer steps, then a block-level model average with block momentum.

    Use on a plain (non-DDP) model whose parameters are identical on every rank when this is
    built (broadcast them first); call `after_optimizer_step()` after every `optimizer.step()`
    on every rank. See the module docstring for the update rule and the Nesterov form.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        block_size: int,
        momentum: float | None = None,
        block_lr: float = 1.0,
        nesterov: bool = True,
        process_group: Any = None,
    ) -> None:
        if block_size < 1:
            raise TrainingError(f"--block-size {block_size} must be >= 1")
        if momentum is not None and not 0.0 <= momentum < 1.0:
            raise TrainingError(f"block momentum {momentum} must be in [0, 1)")
        if block_lr <= 0:
            raise TrainingError(f"block learning rate {block_lr} must be > 0")
        self._group = process_group
        self.world_size = (
            dist.get_world_size(process_group)
            if dist.is_available() and dist.is_initialized()
            else 1
        )
        self.block_size = block_size
        self.momentum = 1.0 - 1.0 / self.world_size if momentum is None else float(momentum)
        self.block_lr = float(block_lr)
        self.nesterov = nesterov
        self._params = list(model.parameters())
        self._buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.meter = CommMeter("bmuf")
        self._collectives = CountingCollectives(self.meter)
        self.global_params = _flatten(self._params)
        # BatchNorm statistics as averaged at the last block end (not filtered by momentum).
        self.global_buffers = _flatten(self._buffers, like=self.global_params)
        self.delta = torch.zeros_like(self.global_params)
        self.local_steps = 0  # every local step so far
        self.block_steps = 0  # local steps since the last synchronisation

    def after_optimizer_step(self) -> bool:
        """Count a local step; at the end of a block, synchronise. True when it synchronised."""
        self.local_steps += 1
        self.block_steps += 1
        self.meter.add_step()
        if self.block_steps < self.block_size:
            return False
        self._synchronise()
        return True

    def end_block(self) -> bool:
        """Close the current block now, however few steps it has: its local progress is merged
        into the global model as at any block end. False (and no communication) when no step
        was taken since the last block end. Every rank must call it at the same point."""
        if self.block_steps == 0:
            return False
        self._synchronise()
        return True

    @contextmanager
    def global_model(self) -> Iterator[None]:
        """Within the block, the model holds the block-level global model: W_global and the
        BatchNorm statistics of the last block end, identical on every rank. On exit every
        rank's local parameters and statistics are put back bit for bit, so validating or
        saving inside never changes training. No communication."""
        local_params, local_buffers = _flatten(self._params), _flatten(self._buffers)
        with torch.no_grad():
            _copy_into(self._params, self.global_params)
            _copy_into(self._buffers, self.global_buffers)
        try:
            yield
        finally:
            with torch.no_grad():
                _copy_into(self._params, local_params)
                _copy_into(self._buffers, local_buffers)

    def _block_start(self) -> torch.Tensor:
        """The model every worker starts a block from: W_global, plus η·Δ under Nesterov."""
        if self.nesterov:
            return self.global_params + self.momentum * self.delta
        return self.global_params

    @torch.no_grad()
    def _synchronise(self) -> None:
        start_s = time.perf_counter()
        flat = torch.cat([_flatten(self._params), _flatten(self._buffers, like=self.global_params)])
        if self.world_size > 1:
            self._collectives.all_reduce(flat, group=self._group)
            flat.div_(self.world_size)
        count = self.global_params.numel()
        # G is measured from where the workers started this block: under Nesterov that is the
        # look-ahead W_global + η·Δ (CNTK's prevWeight). Measuring from W_global would count
        # the momentum twice and Δ would grow without bound under steady progress.
        block_gradient = flat[:count] - self._block_start()
        self.delta.mul_(self.momentum).add_(block_gradient, alpha=self.block_lr)
        # W_global moves by Δ from W_global, not from the look-ahead: adding Δ to S would
        # count η·Δ twice and make the steady block step (1 + η)/(1 - η) times the progress.
        self.global_params = self.global_params + self.delta
        _copy_into(self._params, self._block_start())
        self.global_buffers = flat[count:].clone()
        _copy_into(self._buffers, self.global_buffers)
        self.block_steps = 0
        self.meter.add_interval(start_s, time.perf_counter())

    def state_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "momentum": self.momentum,
            "block_lr": self.block_lr,
            "nesterov": self.nesterov,
            "local_steps": self.local_steps,
            "block_steps": self.block_steps,
            "global_params": self.global_params.detach().cpu().clone(),
            "global_buffers": self.global_buffers.detach().cpu().clone(),
            "delta": self.delta.detach().cpu().clone(),
            "meter": self.meter.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        global_params = state["global_params"]
        if global_params.numel() != self.global_params.numel():
            raise TrainingError(
                f"block momentum state holds {global_params.numel()} parameters, the model "
                f"{self.global_params.numel()}; resume with the same --model"
            )
        if int(state["block_size"]) != self.block_size:
            logger.warning(
                "checkpoint used --bmuf-block-steps %s, this run %s: blocks now end every %s steps",
                state["block_size"],
                self.block_size,
                self.block_size,
            )
        device = self.global_params.device
        self.global_params = global_params.to(device).clone()
        # Older layouts: landcover.training.records.migrate_checkpoint.
        self.global_buffers = state["global_buffers"].to(device).clone()
        self.delta = state["delta"].to(device).clone()
        self.local_steps = int(state["local_steps"])
        self.block_steps = int(state["block_steps"])
        self.meter.load_state_dict(state["meter"])


FIRST_MOMENT_STEP = "exp_avg_step"


def reset_local_momentum(optimizer: torch.optim.Optimizer) -> int:
    """Zero the local optimizer's momentum in place, as CNTK's BMUF does after each model
    average by default: SGD's momentum buffer (SGD has no bias correction: the next step is a
    fresh start's), `ResettableAdamW`'s first moment together with its bias-correction count.
    Returns how many tensors it zeroed (0 for an optimizer without momentum, or before its
    first step). Refuses an Adam that keeps one step count for both moments: zeroing its first
    moment would shrink the following steps (see the module docstring)."""
    zeroed = 0
    with torch.no_grad():
        for state in optimizer.state.values():
            buffer = state.get("momentum_buffer")
            if isinstance(buffer, torch.Tensor):
                buffer.zero_()
                zeroed += 1
            first_moment = state.get("exp_avg")
            if isinstance(first_moment, torch.Tensor):
                if FIRST_MOMENT_STEP not in state:
                    raise TrainingError(
                        f"{type(optimizer).__name__} bias-corrects its first moment with the "
                        "step count of both moments, so zeroing it would shrink the steps "
                        "after it; use landcover.comm.bmuf.ResettableAdamW"
                    )
                first_moment.zero_()
                state[FIRST_MOMENT_STEP] = 0
                zeroed += 1
    return zeroed


class ResettableAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's arithmetic) whose first moment has its own
    bias-correction count, so that `reset_local_momentum` can restart it and the steps after a
    block end keep their nominal size. Until a reset it takes torch.optim.AdamW's steps."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            beta1, beta2 = (float(b) for b in group["betas"])
            for param in group["params"]:
                if param.grad is not None:
                    self._step_one(param, param.grad, lr, beta1, beta2, eps, decay)
        return loss

    def _step_one(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        decay: float,
    ) -> None:
        state = self.state[param]
        if "exp_avg" not in state:
            state["step"] = 0
            state[FIRST_MOMENT_STEP] = 0
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        step = int(state["step"]) + 1
        # State of torch's AdamW (no count of its own): the first moment has seen every step.
        first_moment_step = int(state.get(FIRST_MOMENT_STEP, step - 1)) + 1
        state["step"], state[FIRST_MOMENT_STEP] = step, first_moment_step
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        param.mul_(1 - lr * decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**first_moment_step))


def _flatten(tensors: Sequence[torch.Tensor], like: torch.Tensor | None = None) -> torch.Tensor:
    """A new 1-D tensor holding a copy of `tensors` (in the dtype and device of `like`)."""
    with torch.no_grad():
        if like is not None:
            tensors = [t.detach().to(like) for t in tensors]
        if not tensors:
            return torch.empty(0) if like is None else like.new_empty(0)
        return torch.cat([t.detach().reshape(-1) for t in tensors])


def _copy_into(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(flat[offset : offset + count].view_as(tensor))
        offset += count
