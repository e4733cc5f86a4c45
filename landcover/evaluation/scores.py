"""Scores of a land-cover map against truth: the confusion matrix and, from it, per-class IoU,
precision, recall and F1, pixel accuracy and the mean IoUs (`Evaluation`).

Pixels where either side is nodata (code 0) are not counted. The confusion matrix has truth
in rows and prediction in columns, over codes 1..K-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.errors import EvaluationError
from landcover.markup import markdown_text
from tiling.sources.classes import NODATA_CODE, ClassMap

__all__ = ["ClassScore", "Evaluation", "confusion_matrix", "scores_from_confusion"]


@dataclass(frozen=True, slots=True)
class ClassScore:
    code: int
    name: str
    iou: float | None  # None where the class is in neither truth nor prediction
    precision: float | None
    recall: float | None
    f1: float | None
    truth_pixels: int
    predicted_pixels: int


@dataclass(frozen=True, slots=True)
class Evaluation:
    prediction: str
    truth: tuple[str, ...]
    class_map: ClassMap  # the prediction's class table
    truth_class_map: str  # the remap applied to the truth's raw codes
    confusion: npt.NDArray[np.int64]  # (K-1, K-1), truth rows x predicted columns, codes 1..K-1
    classes: tuple[ClassScore, ...]
    pixels: int
    pixel_accuracy: float
    mean_iou: float  # macro: mean over classes present in truth or prediction
    frequency_weighted_iou: float  # IoU weighted by each class's share of truth pixels

    def to_json(self) -> dict[str, Any]:
        codes = [c.code for c in self.classes]
        return {
            "prediction": self.prediction,
            "truth": list(self.truth),
            "class_map": self.class_map.name,
            "truth_class_map": self.truth_class_map,
            "pixels": self.pixels,
            "pixel_accuracy": self.pixel_accuracy,
            "mean_iou": self.mean_iou,
            "frequency_weighted_iou": self.frequency_weighted_iou,
            "classes": [
                {
                    "code": c.code,
                    "name": c.name,
                    "iou": c.iou,
                    "precision": c.precision,
                    "recall": c.recall,
                    "f1": c.f1,
                    "truth_pixels": c.truth_pixels,
                    "predicted_pixels": c.predicted_pixels,
                }
                for c in self.classes
            ],
            "confusion_matrix": {
                "rows": "truth",
                "columns": "prediction",
                "codes": codes,
                "counts": self.confusion.tolist(),
            },
        }

    def to_markdown(self) -> str:
        lines = [
            f"Pixels compared: {self.pixels:,}  ",
            f"Pixel accuracy: {_fmt(self.pixel_accuracy)}  ",
            f"Mean IoU (macro): {_fmt(self.mean_iou)}  ",
            f"Frequency-weighted IoU: {_fmt(self.frequency_weighted_iou)}",
            "",
            "| code | class | IoU | precision | recall | F1 | truth px | predicted px |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c in self.classes:
            lines.append(
                f"| {c.code} | {markdown_text(c.name)} | {_fmt(c.iou)} | {_fmt(c.precision)} | "
                f"{_fmt(c.recall)} | {_fmt(c.f1)} | {c.truth_pixels:,} | {c.predicted_pixels:,} |"
            )
        return "\n".join(lines) + "\n"


def confusion_matrix(
    truth: npt.NDArray[np.integer[Any]], predicted: npt.NDArray[np.integer[Any]], num_classes: int
) -> npt.NDArray[np.int64]:
    """(K-1, K-1) counts of (truth code, predicted code) over pixels where both are not 0.
    Raises ValueError on a code >= `num_classes` (check the inputs first: see
    `evaluate_prediction`)."""
    t = truth.ravel().astype(np.int64)
    p = predicted.ravel().astype(np.int64)
    for name, codes in (("truth", t), ("predicted", p)):
        if codes.size and int(codes.max()) >= num_classes:
            raise ValueError(f"{name} codes reach {int(codes.max())}, not below {num_classes}")
    keep = (t != NODATA_CODE) & (p != NODATA_CODE)
    k = num_classes - 1
    flat = (t[keep] - 1) * k + (p[keep] - 1)
    return np.bincount(flat, minlength=k * k).reshape(k, k).astype(np.int64)


def scores_from_confusion(
    confusion: npt.NDArray[np.int64],
    class_map: ClassMap,
    *,
    prediction: str = "",
    truth: Sequence[str] = (),
    truth_class_map: str = "",
) -> Evaluation:
    """Per-class IoU / precision / recall / F1, accuracy and mean IoUs from a confusion matrix."""
    total = int(confusion.sum())
    if total == 0:
        raise EvaluationError(
            "no pixel has both a prediction and a truth label; check that they overlap "
            "and that --class-map fits the truth's codes"
        )
    tp = np.diag(confusion).astype(np.float64)
    truth_px = confusion.sum(axis=1)
    pred_px = confusion.sum(axis=0)
    fp = pred_px - tp
    fn = truth_px - tp
    classes = []
    for i, info in enumerate(class_map.classes[1:]):
        classes.append(
            ClassScore(
                code=info.code,
                name=info.name,
                iou=_ratio(tp[i], tp[i] + fp[i] + fn[i]),
                precision=_ratio(tp[i], tp[i] + fp[i]),
                recall=_ratio(tp[i], tp[i] + fn[i]),
                f1=_ratio(2 * tp[i], 2 * tp[i] + fp[i] + fn[i]),
                truth_pixels=int(truth_px[i]),
                predicted_pixels=int(pred_px[i]),
            )
        )
    ious = [c.iou for c in classes if c.iou is not None]
    fw = sum((c.truth_pixels / total) * (c.iou or 0.0) for c in classes)
    return Evaluation(
        prediction=prediction,
        truth=tuple(truth),
        class_map=class_map,
        truth_class_map=truth_class_map,
        confusion=confusion,
        classes=tuple(classes),
        pixels=total,
        pixel_accuracy=float(tp.sum() / total),
        mean_iou=float(np.mean(ious)),
        frequency_weighted_iou=float(fw),
    )


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"
