"""Scores from a confusion matrix (landcover.evaluation.scores), computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from landcover.errors import EvaluationError
from landcover.evaluation import (
    confusion_matrix,
    scores_from_confusion,
)
from tests.landcover.evaluation.maps import (
    CONFUSION,
    FIVE,
    PRED,
    TRUTH_RAW,
)


def test_confusion_matrix_ignores_nodata_on_either_side() -> None:
    truth = FIVE.apply(TRUTH_RAW)
    assert confusion_matrix(truth, PRED, 5).tolist() == CONFUSION


def test_absent_class_has_no_iou_and_is_left_out_of_the_mean() -> None:
    confusion = np.array([[3, 1, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0], [1, 0, 0, 1]], dtype=np.int64)
    ev = scores_from_confusion(confusion, FIVE)
    assert ev.classes[2].iou is None and ev.classes[2].precision is None
    assert ev.classes[3].precision == pytest.approx(1.0) and ev.classes[3].recall == 0.5
    ious = [3 / 5, 2 / 3, 1 / 2]
    assert ev.mean_iou == pytest.approx(sum(ious) / 3)
    with pytest.raises(EvaluationError, match="no pixel has both a prediction and a truth label"):
        scores_from_confusion(np.zeros((4, 4), dtype=np.int64), FIVE)


def test_confusion_matrix_refuses_codes_it_cannot_count() -> None:
    with pytest.raises(ValueError, match="predicted codes reach 7, not below 5"):
        confusion_matrix(FIVE.apply(TRUTH_RAW), np.full_like(PRED, 7), 5)
