"""Score a land-cover raster against truth rasters: confusion matrix, IoU, precision, recall.

Truth rasters in any CRS or resolution are read onto the prediction's grid with nearest
neighbour, block by block (memory bounded by a block, like prediction), their raw codes
remapped with a class map. Pixels where either side is nodata (code 0) are not counted.
The confusion matrix has truth in rows and prediction in columns, over codes 1..K-1.
A predicted code outside the prediction's class table is an error, never skipped: leaving
those pixels out would score the map on the pixels it got into its own table alone.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
from rasterio.windows import Window
from shapely.geometry import box

from landcover.atomic import refuse_existing, write_bytes_atomic, write_text_atomic
from landcover.errors import EvaluationError
from landcover.prediction.outgrid import TAG_CLASS_MAP, OutputGrid, footprint_in_crs
from tiling.classes import (
    DEFAULT_CLASS_MAP,
    NODATA_CODE,
    ClassMap,
    get_class_map,
)
from tiling.errors import TilingError
from tiling.reader import RasterReader
from tiling.sources import RasterInfo, expand_inputs, open_label

logger = logging.getLogger(__name__)

REPORT_FILES = ("metrics.json", "metrics.md", "confusion.png")


@dataclass(frozen=True, slots=True)
class EvaluateConfig:
    """Everything `evaluate_prediction` needs; built by the CLI."""

    prediction: str
    truth: tuple[str, ...]
    class_map: str | None = None  # remap of the truth's raw codes; None: the prediction's
    block_px: int = 2048
    storage_options: Mapping[str, Any] = field(default_factory=dict)


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
                f"| {c.code} | {c.name} | {_fmt(c.iou)} | {_fmt(c.precision)} | "
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


def evaluate_prediction(config: EvaluateConfig) -> Evaluation:
    """Compare `config.prediction` with the truth rasters over the prediction's grid."""
    if config.block_px < 1:
        raise EvaluationError(f"block size {config.block_px} px: must be positive")
    with rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024):
        grid, pred_class_map, tagged = _open_prediction(config.prediction)
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
        # The prediction, described as the "image" whose grid the labels are warped onto.
        pred_info = RasterInfo(
            path=config.prediction,
            crs=grid.crs,
            transform=grid.transform,
            height=grid.height,
            width=grid.width,
            count=1,
            dtype="uint8",
            nodata=NODATA_CODE,
            block_shape=(config.block_px, config.block_px),
            mask_kind="nodata",
        )
        k = pred_class_map.num_classes
        confusion = np.zeros((k - 1, k - 1), dtype=np.int64)
        reader = RasterReader(storage_options=config.storage_options)
        try:
            with rasterio.open(config.prediction) as pred:
                for row0 in range(0, grid.height, config.block_px):
                    for col0 in range(0, grid.width, config.block_px):
                        height = min(config.block_px, grid.height - row0)
                        width = min(config.block_px, grid.width - col0)
                        window = Window(col0, row0, width, height)
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


def check_report_target(out_dir: str | os.PathLike[str], *, overwrite: bool) -> list[Path]:
    """The report's file paths in `out_dir`, refused when `out_dir` is not a directory or,
    unless `overwrite`, already holds one of them. Cheap: call it before evaluating."""
    target = Path(out_dir)
    if target.exists() and not target.is_dir():
        raise EvaluationError(
            f"--out {target}: exists and is not a directory; give a directory for "
            f"{', '.join(REPORT_FILES)}"
        )
    paths = [target / name for name in REPORT_FILES]
    refuse_existing(paths, overwrite=overwrite)
    return paths


def write_report(
    evaluation: Evaluation, out_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> list[Path]:
    """metrics.json, metrics.md and confusion.png in `out_dir`, each replaced atomically once
    all three are rendered (a failing plot replaces nothing)."""
    paths = check_report_target(out_dir, overwrite=overwrite)
    png = confusion_png(evaluation)
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvaluationError(f"--out {out_dir}: cannot create it ({exc.strerror})") from None
    write_text_atomic(paths[0], json.dumps(evaluation.to_json(), indent=2) + "\n")
    write_text_atomic(paths[1], _markdown_report(evaluation))
    write_bytes_atomic(paths[2], png)
    return paths


def plot_confusion(evaluation: Evaluation, path: str | os.PathLike[str]) -> None:
    """Write `confusion_png(evaluation)` to `path` atomically."""
    write_bytes_atomic(path, confusion_png(evaluation))


def confusion_png(evaluation: Evaluation) -> bytes:
    """Row-normalised confusion matrix (each truth class sums to 1) with counts, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    confusion = evaluation.confusion.astype(np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    share = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    names = [c.name for c in evaluation.classes]
    k = len(names)
    fig = Figure(figsize=(2.0 + 1.1 * k, 1.6 + 1.0 * k), dpi=100)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of truth class")
    ax.set_xticks(range(k), names, rotation=35, ha="right")
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("truth")
    ax.set_title(
        f"accuracy {evaluation.pixel_accuracy:.3f}, mIoU {evaluation.mean_iou:.3f}", fontsize=10
    )
    for i in range(k):
        for j in range(k):
            colour = "white" if share[i, j] > 0.5 else "black"
            ax.text(
                j,
                i,
                f"{int(evaluation.confusion[i, j]):,}",
                ha="center",
                va="center",
                color=colour,
                fontsize=8,
            )
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _markdown_report(evaluation: Evaluation) -> str:
    header = [
        f"# Evaluation of {Path(evaluation.prediction).name}",
        "",
        f"Truth: {', '.join(Path(t).name for t in evaluation.truth)} "
        f"(remapped with `{evaluation.truth_class_map}`)  ",
        "",
    ]
    return "\n".join(header) + evaluation.to_markdown()


def _check_codes(
    path: str, predicted: npt.NDArray[np.uint8], class_map: ClassMap, *, tagged: bool
) -> None:
    """Refuse predicted codes outside the class table (see the module docstring); the first
    block that holds any fails the evaluation before the rest is read."""
    k = class_map.num_classes
    outside = np.flatnonzero(np.bincount(predicted.ravel(), minlength=256)[k:]) + k
    if outside.size == 0:
        return
    if tagged:
        table = f"its class table {class_map.name!r}"
    else:
        table = f"the class table {class_map.name!r} assumed for want of a {TAG_CLASS_MAP} tag"
    raise EvaluationError(
        f"{path}: holds class codes {', '.join(str(int(c)) for c in outside[:8])} outside "
        f"{table} (codes 0-{k - 1}); leaving those pixels out would inflate the scores: "
        "evaluate a map written by `landcover predict`"
    )


def _open_prediction(path: str) -> tuple[OutputGrid, ClassMap, bool]:
    try:
        with rasterio.open(path) as ds:
            if ds.count != 1 or ds.dtypes[0] != "uint8" or ds.crs is None:
                raise EvaluationError(
                    f"{path}: expected a 1-band uint8 georeferenced land-cover raster "
                    f"(found {ds.count} bands of {ds.dtypes[0]}); pass the output of "
                    "`landcover predict`"
                )
            t = ds.transform
            if t.b != 0 or t.d != 0:
                raise EvaluationError(
                    f"{path}: rotated rasters are not supported; warp it north-up"
                )
            grid = OutputGrid(ds.crs, t, int(ds.width), int(ds.height))
            tag = ds.tags().get(TAG_CLASS_MAP)
    except rasterio.errors.RasterioIOError as exc:
        raise EvaluationError(
            f"{path}: cannot open the prediction ({exc})".splitlines()[0]
        ) from None
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


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"
