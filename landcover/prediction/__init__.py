"""Prediction of a region: its configuration (`PredictConfig`), the region, the output grid,
blending of overlapping windows, the windowed runner, the COG outputs and the tiled map
product."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig
    from landcover.prediction.outgrid import OutputGrid, plan_output_grid
    from landcover.prediction.region import Region, parse_bbox, parse_region
    from landcover.prediction.runner import PredictResult, predict_region
    from landcover.prediction.tiled import predict_product, predict_tiles
    from landcover.prediction.tileplan import TiledSetup

__all__ = [
    "OutputGrid",
    "PredictConfig",
    "PredictResult",
    "Region",
    "TiledSetup",
    "parse_bbox",
    "parse_region",
    "plan_output_grid",
    "predict_product",
    "predict_region",
    "predict_tiles",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PredictConfig": "config",
        "PredictResult": "runner",
        "predict_region": "runner",
        "Region": "region",
        "parse_bbox": "region",
        "parse_region": "region",
        "OutputGrid": "outgrid",
        "plan_output_grid": "outgrid",
        "TiledSetup": "tileplan",
        "predict_product": "tiled",
        "predict_tiles": "tiled",
    },
)
