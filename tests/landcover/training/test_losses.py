"""Class weights, the segmentation loss and the validation scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from landcover.training.losses import (
    class_weights_from_counts,
    confusion_counts,
    dice_loss,
    scores_from_confusion,
    segmentation_loss,
)


def test_median_frequency_class_weights() -> None:
    weights = class_weights_from_counts([500, 100, 300, 0, 900], 5)
    # Frequencies of the present classes 1, 2, 4: 0.0769, 0.2308, 0.6923; median 0.2308.
    assert weights[0] == 0.0 and weights[3] == 0.0
    assert weights == pytest.approx([0.0, 3.0, 1.0, 0.0, 1 / 3])
    assert max(class_weights_from_counts([0, 1, 10**6], 3)) == 10.0  # clipped


def test_scores_from_confusion() -> None:
    # rows = truth, columns = prediction; class 3 never occurs, class 0 is nodata.
    cm = np.zeros((4, 4), np.int64)
    cm[1, 1], cm[1, 2], cm[2, 2], cm[2, 1] = 6, 2, 3, 1
    scores = scores_from_confusion(cm)
    assert scores.per_class_iou == pytest.approx([None, 6 / 9, 3 / 6, None])
    assert scores.miou == pytest.approx((6 / 9 + 3 / 6) / 2)
    assert scores.accuracy == pytest.approx(9 / 12)


def test_confusion_counts_skip_nodata_truth() -> None:
    labels = torch.tensor([[0, 1, 1], [2, 2, 0]])
    pred = torch.tensor([[3, 1, 2], [2, 1, 1]])
    counts = confusion_counts(pred, labels, 4).reshape(4, 4)
    expected = torch.zeros(4, 4, dtype=torch.int64)
    expected[1, 1], expected[1, 2], expected[2, 2], expected[2, 1] = 1, 1, 1, 1
    assert torch.equal(counts, expected)


def test_loss_ignores_nodata_and_never_returns_nan() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 6, 6)
    labels = torch.randint(1, 5, (2, 6, 6))
    labels[:, :3] = 0
    weights = torch.tensor([0.0, 1.0, 2.0, 1.0, 0.5])
    base = segmentation_loss(logits, labels, class_weights=weights, dice=True)
    changed = logits.clone()
    changed[:, :, :3] = torch.randn(2, 5, 3, 6) * 10  # only nodata pixels
    assert segmentation_loss(changed, labels, class_weights=weights, dice=True) == base
    reference = torch.nn.functional.cross_entropy(logits, labels, weight=weights, ignore_index=0)
    plain = segmentation_loss(logits, labels, class_weights=weights, dice=False)
    assert plain == pytest.approx(float(reference), rel=1e-6)
    nodata = segmentation_loss(logits, torch.zeros_like(labels), class_weights=None, dice=True)
    assert float(nodata) == 0.0


def test_unweighted_loss_is_the_mean_cross_entropy_over_labelled_pixels() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 5, 7)
    labels = torch.randint(0, 4, (2, 5, 7))
    reference = torch.nn.functional.cross_entropy(logits, labels, ignore_index=0)
    loss = segmentation_loss(logits, labels, class_weights=None, dice=False)
    assert float(loss) == pytest.approx(float(reference), rel=1e-6)


def test_dice_loss_is_zero_for_a_perfect_prediction() -> None:
    labels = torch.randint(1, 4, (2, 8, 8))
    perfect = torch.nn.functional.one_hot(labels, 4).permute(0, 3, 1, 2).float() * 50
    assert float(dice_loss(perfect, labels)) == pytest.approx(0.0, abs=1e-6)
    assert float(dice_loss(-perfect, labels)) > 0.9
