"""Prediction configs of the library tests: one scene, a model file, an output, on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from landcover.prediction.config import PredictConfig


def config_for(model: Path, scene: Path, out: Path | str, **options: Any) -> PredictConfig:
    """The config that predicts `scene` with `model` into `out` on the CPU; `options` are
    PredictConfig fields."""
    return PredictConfig(str(model), (str(scene),), str(out), device="cpu", **options)
