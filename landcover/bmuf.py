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
statistics (float buffers) are averaged at each block boundary, without momentum. The local
optimizer's momentum (SGD's buffer, Adam's first moment) is zeroed after every block end by
default (`reset_local_momentum`, CNTK's `reset_sgd_momentum_after_aggregation`): it points where
this worker's own model was heading, the block update has moved every model somewhere else, and
the block momentum already carries the direction. Measured (SGD, 2 workers, 12 epochs, best
val mIoU minus plain DDP's): unet_resnet18 on bench_comm's store, seeds 0 / 1, kept -0.056 /
-0.002, reset +0.006 / +0.029; small_unet on test_comm_training's store, seeds 0-3, kept
+0.015 on average, reset +0.025 (mean of the last 3 epochs: +0.019 and +0.050). The trainer's
`--keep-local-momentum` keeps it. `BlockMomentum.state_dict()` holds this rank's Δ, W_global,
the BatchNorm statistics of the last block end and the position in the block; resuming
mid-block also needs each rank's own local model and optimizer state (they differ between
ranks until the block ends).

Validation and saving use the block-level global model: inside `with bmuf.global_model():`
the model holds W_global and the BatchNorm statistics averaged at the last block end (the
same on every rank), and on exit each rank gets its local weights back, bit for bit. We chose
this over closing the partial block early (an extra model average whenever someone wants to
look, as CNTK does before a checkpoint) because looking then never changes training: blocks
keep `block_size` steps whatever the epoch length, a run validated or checkpointed more often
follows the same trajectory, and a checkpoint taken mid-block (local models and optimizer
states next to W_global and Δ) resumes into exactly the uninterrupted run. The price: mid-block
the global model lacks the local steps since the last block end (at most `block_size - 1`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from landcover.comm import CommMeter, CountingCollectives
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
        self.local_steps = 0

    def after_optimizer_step(self) -> bool:
        """Count a local step; at the end of a block, synchronise. True when it synchronised."""
        self.local_steps += 1
        self.meter.add_step()
        if self.local_steps % self.block_size:
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
        self.meter.add_interval(start_s, time.perf_counter())

    def state_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "momentum": self.momentum,
            "block_lr": self.block_lr,
            "nesterov": self.nesterov,
            "local_steps": self.local_steps,
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
                "checkpoint used --block-size %s, this run %s: blocks now end every %s steps",
                state["block_size"],
                self.block_size,
                self.block_size,
            )
        device = self.global_params.device
        self.global_params = global_params.to(device).clone()
        if "global_buffers" in state:  # older checkpoints lack it: own stats until the block end
            self.global_buffers = state["global_buffers"].to(device).clone()
        self.delta = state["delta"].to(device).clone()
        self.local_steps = int(state["local_steps"])
        self.meter.load_state_dict(state.get("meter", {}))


# The optimizer state that is momentum: SGD's buffer, Adam's and AdamW's first moment. Adam's
# second moment is a per-coordinate scale, not a direction, and its bias correction assumes it
# was never zeroed, so it stays.
_MOMENTUM_STATE = ("momentum_buffer", "exp_avg")


def reset_local_momentum(optimizer: torch.optim.Optimizer) -> int:
    """Zero the local optimizer's momentum (SGD's buffer, Adam's first moment) in place, as
    CNTK's BMUF does after each model average by default. Returns how many tensors it zeroed
    (0 for an optimizer without momentum, or before its first step)."""
    zeroed = 0
    with torch.no_grad():
        for state in optimizer.state.values():
            for key in _MOMENTUM_STATE:
                value = state.get(key)
                if isinstance(value, torch.Tensor):
                    value.zero_()
                    zeroed += 1
    return zeroed


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
