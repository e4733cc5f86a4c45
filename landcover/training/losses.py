"""What training minimises and how validation scores it: class weights, cross-entropy (+ Dice)
over labelled pixels, and the confusion counts that mIoU and accuracy come from.

Code 0 is nodata everywhere: never a target in the loss, never counted in a score. The scores
here are computed on tensors during training; `landcover.evaluation` scores a finished map
raster against truth rasters, with precision and recall as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

MAX_CLASS_WEIGHT = 10.0


def class_weights_from_counts(counts: Sequence[int], num_classes: int) -> list[float]:
    """Median-frequency balancing: w_c = median(f) / f_c over the classes present, clipped to
    [1/MAX, MAX] so a class with a handful of pixels cannot dominate; nodata and absent
    classes get 0 (they are never a target)."""
    padded = np.zeros(num_classes, dtype=np.float64)
    values = np.asarray(counts, dtype=np.float64)[:num_classes]
    padded[: len(values)] = values
    padded[0] = 0.0
    present = padded > 0
    weights = np.zeros(num_classes, dtype=np.float64)
    if present.any():
        freq = padded[present] / padded[present].sum()
        weights[present] = np.clip(np.median(freq) / freq, 1 / MAX_CLASS_WEIGHT, MAX_CLASS_WEIGHT)
    return [float(w) for w in weights]


def segmentation_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    class_weights: torch.Tensor | None,
    dice: bool,
) -> torch.Tensor:
    """Cross-entropy over labelled pixels (code 0 = nodata is ignored), optionally + soft Dice.

    Computed as a sum over a clamped weight total instead of `reduction="mean"`, so a batch
    of nodata only gives 0 (not NaN) without a host sync to check for it.
    """
    weights = class_weights
    if weights is None:
        weights = torch.ones(logits.shape[1], device=logits.device)
        weights[0] = 0.0
    total = F.cross_entropy(logits, labels, weight=weights, ignore_index=0, reduction="sum")
    loss = total / weights[labels].sum().clamp_min(1e-6)
    if dice:
        loss = loss + dice_loss(logits, labels)
    return loss


def dice_loss(logits: torch.Tensor, labels: torch.Tensor, *, smooth: float = 1.0) -> torch.Tensor:
    """1 - mean soft Dice over the classes (not nodata) present in the batch's labels."""
    num_classes = logits.shape[1]
    valid = (labels != 0).unsqueeze(1).to(logits.dtype)
    probs = logits.softmax(dim=1) * valid
    target = F.one_hot(labels, num_classes).permute(0, 3, 1, 2).to(logits.dtype) * valid
    dims = (0, 2, 3)
    intersection = (probs * target).sum(dims)[1:]
    cardinality = (probs.sum(dims) + target.sum(dims))[1:]
    present = (target.sum(dims)[1:] > 0).to(logits.dtype)
    dice = (2 * intersection + smooth) / (cardinality + smooth)
    return ((1 - dice) * present).sum() / present.sum().clamp_min(1.0)


def confusion_counts(pred: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Flattened (truth, prediction) counts over labelled pixels, int64 of length K*K."""
    valid = labels != 0
    index = labels[valid] * num_classes + pred[valid]
    return torch.bincount(index, minlength=num_classes * num_classes)


@dataclass(frozen=True, slots=True)
class Scores:
    miou: float
    accuracy: float
    per_class_iou: list[float | None]  # index = class code; nodata and absent classes None


def scores_from_confusion(confusion: np.ndarray[Any, Any]) -> Scores:
    """mIoU over the classes (not nodata) that occur in truth or prediction; pixel accuracy."""
    cm = confusion.astype(np.float64)
    tp = np.diag(cm)
    union = cm.sum(axis=0) + cm.sum(axis=1) - tp
    per_class: list[float | None] = [None]
    for code in range(1, cm.shape[0]):
        per_class.append(float(tp[code] / union[code]) if union[code] > 0 else None)
    present = [v for v in per_class if v is not None]
    miou = float(np.mean(present)) if present else float("nan")
    total = cm.sum()
    accuracy = float(tp.sum() / total) if total > 0 else float("nan")
    return Scores(miou=miou, accuracy=accuracy, per_class_iou=per_class)
