"""The optimizer of a training run and its learning-rate schedule, a function of epochs done.

`build_optimizer`: AdamW or SGD with Nesterov momentum 0.9; under BMUF with momentum resets,
AdamW is `landcover.comm.bmuf.ResettableAdamW` (why: see that module).

The base `--lr` is multiplied by a function of the world size (`--lr-scaling linear`, the
"linear scaling rule"; `sqrt` and `none` too; never with BMUF, whose learners step like a
single worker), warmed up linearly from ~0 over `--warmup-epochs`, then decayed along a cosine
to 1 % of the peak at the end of the last epoch.

Every quantity is derived from the world this process runs in: the peak from its world size,
the warm-up and total step counts from its steps per epoch. A resumed run continues at the
start of the next epoch, `epochs_done * steps_per_epoch`, in its own steps: a position in
epochs, i.e. in samples seen, never the old world's step count. So an elastic restart on fewer
workers trains at its own peak lr and ends where an uninterrupted run in that world ends (~1 %
of the peak), and at an unchanged world size the resumed lrs are bit for bit the uninterrupted
ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from landcover.errors import TrainingError

__all__ = ["MIN_LR_RATIO", "LrSchedule", "build_optimizer", "lr_scale", "warmup_cosine"]

MIN_LR_RATIO = 0.01


def build_optimizer(
    name: str,
    params: Iterable[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    momentum_resets: bool = False,
) -> torch.optim.Optimizer:
    """`--optimizer adamw|sgd`. `momentum_resets`: the first moment will be zeroed now and then
    (BMUF block ends), which torch's AdamW cannot bias-correct."""
    if name == "adamw" and momentum_resets:
        from landcover.comm.bmuf import ResettableAdamW

        return ResettableAdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay
        )
    raise TrainingError(f"--optimizer {name!r}: use one of ('adamw', 'sgd')")


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """LR multiplier of optimizer step `step` (0-based): linear warm-up to 1 over
    `warmup_steps`, then a cosine from 1 that reaches MIN_LR_RATIO at `total_steps`, one past
    the last step (which runs at MIN_LR_RATIO + ~2.4 / decay steps², 1.02 % of the peak after
    100 decay steps)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_scale(scaling: str, world_size: int) -> float:
    """How much the base lr grows with `world_size` workers under `--lr-scaling`."""
    return {"linear": float(world_size), "sqrt": math.sqrt(world_size), "none": 1.0}[scaling]


@dataclass(frozen=True, slots=True)
class LrSchedule:
    """Peak lr and step counts of a run in the world it runs in."""

    peak_lr: float
    steps_per_epoch: int
    warmup_steps: int
    total_steps: int

    @classmethod
    def for_world(
        cls,
        *,
        base_lr: float,
        lr_scaling: str,
        world_size: int,
        block_momentum: bool,
        epochs: int,
        warmup_epochs: float,
        steps_per_epoch: int,
    ) -> LrSchedule:
        scale = 1.0 if block_momentum else lr_scale(lr_scaling, world_size)
        total = epochs * steps_per_epoch
        return cls(
            peak_lr=base_lr * scale,
            steps_per_epoch=steps_per_epoch,
            warmup_steps=min(round(warmup_epochs * steps_per_epoch), total // 2),
            total_steps=total,
        )

    def multiplier(self, step: int) -> float:
        return warmup_cosine(step, warmup_steps=self.warmup_steps, total_steps=self.total_steps)

    def lr(self, step: int) -> float:
        return self.peak_lr * self.multiplier(step)

    def attach(
        self, optimizer: torch.optim.Optimizer, *, epochs_done: int
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """A scheduler that sets `optimizer`'s lr for the first step of epoch `epochs_done + 1`
        now and steps along the schedule after each optimizer step. Overrides whatever lr a
        loaded optimizer state carries (another world's)."""
        for group in optimizer.param_groups:
            group["initial_lr"] = self.peak_lr
            group["lr"] = self.peak_lr
        multiplier = self.multiplier
        # LambdaLR steps once on construction: to position `last_epoch + 1`.
        position = epochs_done * self.steps_per_epoch
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: multiplier(step), last_epoch=position - 1
        )
