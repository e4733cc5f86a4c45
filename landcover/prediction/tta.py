"""Test-time augmentation: a window's logits averaged over symmetries of the square.

Each pass runs the model on the window under one of `landcover.data.augment`'s `dihedral`
ops and maps its logits back with `inverse_dihedral`, so every pass's logits line up with the
window before they are averaged and blended. `--tta d4` uses all 8 elements of the group
(identity, 3 rotations by 90 degrees, 4 reflections); `--tta flips` the 4 of the flip subgroup
(identity, left-right, up-down, both = rotation by 180 degrees), at half the cost. A model
runs once per element, so TTA costs 8x (d4) or 4x (flips) the model's time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from landcover.data.augment import dihedral, inverse_dihedral
from landcover.errors import PredictionError
from landcover.prediction.choices import TTA_OPS


def tta_ops(name: str) -> tuple[int, ...]:
    """The dihedral ops of the TTA mode `name` (none, flips, d4)."""
    ops = TTA_OPS.get(name)
    if ops is None:
        raise PredictionError(f"--tta {name!r}: choose one of {', '.join(TTA_OPS)}")
    return ops


def average_over_symmetries(
    model_pass: Callable[[torch.Tensor], torch.Tensor],
    pixels: torch.Tensor,
    ops: Sequence[int],
) -> torch.Tensor:
    """The mean over `ops` of `inverse(model_pass(op(pixels)))`; exactly `model_pass(pixels)`
    for the identity alone."""
    if tuple(ops) == (0,):
        return model_pass(pixels)
    total: torch.Tensor | None = None
    for op in ops:
        logits = model_pass(dihedral(pixels, op).contiguous())
        back = dihedral(logits, inverse_dihedral(op))
        total = back.clone() if total is None else total.add_(back)
    if total is None:
        raise ValueError("no TTA ops")  # a bug: tta_ops never gives none
    return total.div_(len(ops))
