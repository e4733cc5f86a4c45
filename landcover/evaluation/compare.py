"""Comparing a predicted land-cover raster with truth rasters, block by block.

Truth rasters in any CRS or resolution are read onto the prediction's grid with nearest
neighbour, block by block (memory bounded by a block, like prediction), their raw codes
remapped with a class map, and counted into a confusion matrix (`landcover.evaluation.scores`).
A predicted code outside the prediction's class table is an error, never skipped: leaving
those pixels out would score the map on the pixels it got into its own table alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
from shapely.geometry import box

from landcover.classes import unknown_codes
from landcover.errors import EvaluationError, reason
from landcover.evaluation.config import EvaluateConfig
from landcover.evaluation.scores import Evaluation, confusion_matrix, scores_from_confusion
from landcover.prediction.outgrid import TAG_CLASS_MAP, OutputGrid, footprint_in_crs
from landcover.view.display import DisplayGrid
from landcover.view.mapfile import wrong_bands
from tiling.errors import TilingError
from tiling.runtime.urls import check_remote_file
from tiling.sources.classes import (
    DEFAULT_CLASS_MAP,
    NODATA_CODE,
    ClassMap,
    get_class_map,
)
from tiling.sources.rasters import RasterInfo, expand_inputs, open_label
from tiling.sources.reader import RasterReader

__all__ = ["evaluate_prediction", "prediction_on_grid"]

logger = logging.getLogger(__name__)


def evaluate_prediction(config: EvaluateConfig) -> Evaluation:
    """Compare `config.prediction` with the truth rasters over the prediction's grid."""
    with rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024):
        grid, pred_class_map, tagged = _open_prediction(
            config.prediction, storage_options=config.storage_options
        )
        truth_map = _truth_class_map(config.class_map, pred_class_map)
        if truth_map.num_classes != pred_class_map.num_classes:
            raise EvaluationError(
                f"--class-map {truth_map.name} has {truth_map.num_classes - 1} classes but the "
                f"prediction's table {pred_class_map.name!r} has "
                f"{pred_class_map.num_classes - 1}; choose a class map onto the same classes"
            )
        paths = expand_inputs(config.truth, storage_options=config.storage_options, what="truth")
        truth = _overlapping(
            grid,
            [open_label(p, storage_options=config.storage_options) for p in paths],
            config.prediction,
        )
        pred_info = prediction_on_grid(
            config.prediction, grid, block_shape=(config.block_px, config.block_px)
        )
        k = pred_class_map.num_classes
        confusion = np.zeros((k - 1, k - 1), dtype=np.int64)
        reader = RasterReader(storage_options=config.storage_options)
        try:
            with rasterio.open(config.prediction) as pred:
                for block in grid.window.blocks(config.block_px):
                    window = block.to_rasterio()
                    predicted = pred.read(1, window=window)
                    _check_codes(config.prediction, predicted, pred_class_map, tagged=tagged)
                    codes = reader.read_labels(pred_info, window, truth, truth_map)
                    confusion += confusion_matrix(codes, predicted, k)
        finally:
            reader.close()
    return scores_from_confusion(
        confusion,
        pred_class_map,
        prediction=config.prediction,
        truth=tuple(s.path for s in truth),
        truth_class_map=truth_map.name,
    )


def prediction_on_grid(
    path: str, grid: OutputGrid | DisplayGrid, *, block_shape: tuple[int, int]
) -> RasterInfo:
    """The prediction `path` on `grid`, described as the "image" whose grid the truth labels
    are warped onto (`RasterReader.read_labels`), read in blocks of `block_shape`."""
    return RasterInfo(
        path=path,
        crs=grid.crs,
        transform=grid.transform,
        height=grid.height,
        width=grid.width,
        count=1,
        dtype="uint8",
        nodata=NODATA_CODE,
        block_shape=block_shape,
        mask_kind="nodata",
    )


def _check_codes(
    path: str, predicted: npt.NDArray[np.uint8], class_map: ClassMap, *, tagged: bool
) -> None:
    """Refuse predicted codes outside the class table (see the module docstring); the first
    block that holds any fails the evaluation before the rest is read."""
    assumed = f"the class table {class_map.name!r} assumed for want of a {TAG_CLASS_MAP} tag"
    unknown = unknown_codes(predicted, class_map, table=None if tagged else assumed)
    if unknown is None:
        return
    raise EvaluationError(
        f"{path}: {unknown}; leaving those pixels out would inflate the scores: evaluate a map "
        "written by `landcover predict`"
    )


def _open_prediction(
    path: str, *, storage_options: Mapping[str, Any]
) -> tuple[OutputGrid, ClassMap, bool]:
    try:
        with rasterio.open(path) as ds:
            wrong = wrong_bands(ds)
            if wrong is not None:
                raise EvaluationError(f"{path}: {wrong}; pass the output of `landcover predict`")
            if ds.crs is None:
                raise EvaluationError(
                    f"{path}: the map has no CRS, so it cannot be laid over the truth; assign "
                    f"the CRS it was predicted in (e.g. gdal_edit.py -a_srs EPSG:26918 {path}) "
                    "or pass the output of `landcover predict`, which has one"
                )
            t = ds.transform
            if t.b != 0 or t.d != 0:
                raise EvaluationError(
                    f"{path}: rotated rasters are not supported; warp it north-up"
                )
            grid = OutputGrid(ds.crs, t, int(ds.width), int(ds.height))
            tag = ds.tags().get(TAG_CLASS_MAP)
    except rasterio.errors.RasterioIOError as exc:
        check_remote_file(path, storage_options)  # a 404 or a dead host: say that instead
        raise EvaluationError(f"{path}: cannot open the prediction ({reason(exc)})") from None
    if tag is None:
        logger.info("%s has no class table; assuming %s", path, DEFAULT_CLASS_MAP)
        return grid, get_class_map(DEFAULT_CLASS_MAP), False
    try:
        return grid, ClassMap.from_json(json.loads(tag)), True
    except (ValueError, KeyError, TypeError):
        raise EvaluationError(
            f"{path}: damaged {TAG_CLASS_MAP} metadata; pass --class-map"
        ) from None


def _truth_class_map(name: str | None, pred_class_map: ClassMap) -> ClassMap:
    try:
        if name is None:
            return pred_class_map
        return get_class_map(name, num_classes=pred_class_map.num_classes)
    except TilingError as exc:
        raise EvaluationError(str(exc)) from None


def _overlapping(
    grid: OutputGrid, truth: Sequence[RasterInfo], prediction: str
) -> tuple[RasterInfo, ...]:
    rect = box(*grid.bounds)
    hits = tuple(s for s in truth if footprint_in_crs(s, grid.crs).intersection(rect).area > 0)
    if not hits:
        names = ", ".join(Path(s.path).name for s in truth)
        raise EvaluationError(
            f"truth ({names}) does not overlap the prediction {prediction}; "
            "give truth rasters that cover the predicted region"
        )
    return hits
