"""Evaluation of a land-cover map against truth: the scores (confusion matrix, IoU,
precision, recall), the comparison of a predicted raster with truth rasters, and the report
(metrics.json, metrics.md, confusion.png; with the scenes' panels, classes.png, panel-NN.png
and report.html)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.evaluation.compare import evaluate_prediction
    from landcover.evaluation.config import EvaluateConfig
    from landcover.evaluation.panels import ScenePanel, scene_panels
    from landcover.evaluation.report import (
        REPORT_FILES,
        check_report_target,
        confusion_png,
        plot_confusion,
        write_report,
    )
    from landcover.evaluation.scores import (
        ClassScore,
        Evaluation,
        confusion_matrix,
        scores_from_confusion,
    )

__all__ = [
    "REPORT_FILES",
    "ClassScore",
    "EvaluateConfig",
    "Evaluation",
    "ScenePanel",
    "check_report_target",
    "confusion_matrix",
    "confusion_png",
    "evaluate_prediction",
    "plot_confusion",
    "scene_panels",
    "scores_from_confusion",
    "write_report",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "EvaluateConfig": "config",
        "evaluate_prediction": "compare",
        "ScenePanel": "panels",
        "scene_panels": "panels",
        "REPORT_FILES": "report",
        "check_report_target": "report",
        "confusion_png": "report",
        "plot_confusion": "report",
        "write_report": "report",
        "ClassScore": "scores",
        "Evaluation": "scores",
        "confusion_matrix": "scores",
        "scores_from_confusion": "scores",
    },
)
