"""Prediction of a region: the region, the output grid, blending of overlapping windows, the
windowed runner and the COG outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.prediction.outgrid import OutputGrid, plan_output_grid
    from landcover.prediction.region import Region, parse_bbox, parse_region
    from landcover.prediction.runner import PredictConfig, PredictResult, predict_region

__all__ = [
    "OutputGrid",
    "PredictConfig",
    "PredictResult",
    "Region",
    "parse_bbox",
    "parse_region",
    "plan_output_grid",
    "predict_region",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PredictConfig": "runner",
        "PredictResult": "runner",
        "predict_region": "runner",
        "Region": "region",
        "parse_bbox": "region",
        "parse_region": "region",
        "OutputGrid": "outgrid",
        "plan_output_grid": "outgrid",
    },
)
