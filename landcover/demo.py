"""The whole pipeline on generated data: synth → tile → scale (1, 2 workers) → report →
predict a region spanning two scenes → evaluate.

What the demo proves is only honest if the map is scored where the model never looked: one
scene (the top-right one) is synthesised but NOT tiled, so no chip of it reaches training or
validation. The region straddles it and a training scene, and the accuracy floor applies to
the held-out scene alone.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyproj
from shapely.geometry import Polygon, mapping
from shapely.ops import transform as shapely_transform

from cluster.spec import ClusterSpec, load_cluster_spec, local_spec
from cluster.sweep import SweepConfig, SweepResult, run_sweep
from landcover.errors import LandcoverError
from landcover.evaluate import EvaluateConfig, Evaluation, evaluate_prediction, write_report
from landcover.predict import PredictConfig, PredictResult, predict_region
from landcover.region import parse_region
from landcover.report import ReportPaths, write_scaling_report
from landcover.runs import load_runs
from tiling.synth import SynthConfig, SynthResult, synthesize_scenes
from tiling.tile import TileConfig, TileResult, tile

logger = logging.getLogger(__name__)

DEMO_MARKER = "demo.json"
HELD_OUT_SCENE = 1  # top-right scene of the 2 x 2 grid: never tiled, so never trained on


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Sizes chosen so the whole demo runs in a few minutes on 2 CPU cores."""

    out_dir: Path
    scenes: int = 4
    size_px: int = 1024
    seed: int = 0
    chip_size: int = 128
    epochs: int = 6
    batch_size: int = 8
    workers: tuple[int, ...] = (1, 2)
    model: str = "small_unet"
    cluster_json: Path | None = Path("cluster.json")
    accuracy_floor: float = 0.70
    extra_train_args: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class DemoResult:
    out_dir: Path
    synth: SynthResult
    store: TileResult
    sweep: SweepResult
    report: ReportPaths
    model_path: Path
    region_path: Path
    prediction: PredictResult
    evaluation: Evaluation
    held_out: Evaluation
    evaluation_dir: Path
    elapsed_s: float


Stage = Callable[[str], None]


def run_demo(config: DemoConfig, *, on_stage: Stage | None = None) -> DemoResult:
    """Run every stage into `config.out_dir`; raise LandcoverError if the map is garbage."""
    started = time.perf_counter()
    stage = on_stage or (lambda name: logger.info("%s", name))
    if config.scenes < 2:
        raise LandcoverError(f"demo needs --scenes >= 2 (a held-out scene), got {config.scenes}")
    out = _fresh_dir(config.out_dir)

    stage("synthesise scenes")
    synth = synthesize_scenes(
        SynthConfig(
            out_dir=out / "data", scenes=config.scenes, size_px=config.size_px, seed=config.seed
        )
    )
    train_images = [p for i, p in enumerate(synth.image_paths) if i != HELD_OUT_SCENE]

    stage("tile into a chip store")
    store_url = str(out / "chips.zarr")
    tiled = tile(
        TileConfig(
            images=tuple(str(p) for p in train_images),
            labels=(str(out / "data" / "labels"),),
            out=store_url,
            chip_size=config.chip_size,
            shard_size=32,
            val_fraction=0.2,
        )
    )

    stage(f"train at {', '.join(map(str, config.workers))} workers (local cluster engine)")
    sweep = run_sweep(
        SweepConfig(
            store=store_url,
            workers=config.workers,
            epochs=config.epochs,
            out_dir=str(out / "scaling"),
            extra_args=(
                "--model",
                config.model,
                "--batch-size",
                str(config.batch_size),
                "--seed",
                str(config.seed),
                *config.extra_train_args,
            ),
            cluster=_cluster_spec(config),
        )
    )
    if sweep.failed:
        first = sweep.failed[0]
        raise LandcoverError(
            f"demo training at {first.workers} workers failed: {first.error}; "
            f"logs in {first.log_dir}"
        )

    stage("scaling report")
    report = write_scaling_report(load_runs([out / "scaling"]), out / "report")

    stage("predict a region spanning two scenes")
    model_path = sweep.path.parent / sweep.runs[-1].run_dir / "model.pt"  # run_dir is relative
    region_path = out / "region.geojson"
    _write_geojson(_polygon_across_scenes(synth, config), region_path)
    prediction = predict_region(
        PredictConfig(
            model=str(model_path),
            images=tuple(str(p) for p in synth.image_paths),
            out=str(out / "landcover.tif"),
            region=parse_region(str(region_path)),
            probabilities=str(out / "probabilities.tif"),
            batch_size=16,
        )
    )

    stage("evaluate against the synthetic truth")
    labels = tuple(str(p) for p in synth.label_paths)
    evaluation = evaluate_prediction(EvaluateConfig(prediction=prediction.out, truth=labels))
    held_out = evaluate_prediction(
        EvaluateConfig(prediction=prediction.out, truth=(labels[HELD_OUT_SCENE],))
    )
    evaluation_dir = out / "evaluation"
    write_report(evaluation, evaluation_dir)
    write_report(held_out, evaluation_dir / "held-out-scene")

    result = DemoResult(
        out_dir=out,
        synth=synth,
        store=tiled,
        sweep=sweep,
        report=report,
        model_path=model_path,
        region_path=region_path,
        prediction=prediction,
        evaluation=evaluation,
        held_out=held_out,
        evaluation_dir=evaluation_dir,
        elapsed_s=time.perf_counter() - started,
    )
    _write_marker(result, config)
    if held_out.pixel_accuracy < config.accuracy_floor:
        raise LandcoverError(
            f"demo map accuracy on the held-out scene is {held_out.pixel_accuracy:.3f}, below "
            f"the floor {config.accuracy_floor:.2f}: the pipeline produced garbage; "
            f"see {evaluation_dir}"
        )
    return result


def _fresh_dir(path: Path) -> Path:
    """An empty output directory; a previous demo's output is replaced, anything else kept."""
    if path.exists():
        if not path.is_dir():
            raise LandcoverError(f"{path}: exists and is not a directory; choose another --out")
        if any(path.iterdir()) and not (path / DEMO_MARKER).exists():
            raise LandcoverError(
                f"{path}: exists and holds no earlier demo output; choose an empty or new --out"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / DEMO_MARKER).write_text(json.dumps({"state": "running"}))
    return path.resolve()


def _cluster_spec(config: DemoConfig) -> ClusterSpec:
    if config.cluster_json is not None and config.cluster_json.exists():
        return load_cluster_spec(config.cluster_json)
    logger.info("no %s here: using this machine (local engine)", config.cluster_json)
    return local_spec(max(config.workers))


def _polygon_across_scenes(synth: SynthResult, config: DemoConfig) -> Polygon:
    """A hexagon over the seam between scene 0 (top-left) and the held-out scene 1 (top-right),
    in EPSG:4326 (GeoJSON's CRS), as a user would draw it."""
    minx, _, _, maxy = synth.bounds
    width_m = config.size_px * 1.0
    seam_x = minx + width_m
    cy = maxy - width_m / 2
    rx, ry = 0.45 * width_m, 0.4 * width_m
    hexagon = Polygon(
        [
            (seam_x - rx, cy),
            (seam_x - rx / 2, cy + ry),
            (seam_x + rx / 2, cy + ry),
            (seam_x + rx, cy),
            (seam_x + rx / 2, cy - ry),
            (seam_x - rx / 2, cy - ry),
        ]
    )
    to_wgs84 = pyproj.Transformer.from_crs(synth.crs, "EPSG:4326", always_xy=True).transform
    polygon: Polygon = shapely_transform(to_wgs84, hexagon)
    return polygon


def _write_geojson(polygon: Polygon, path: Path) -> None:
    feature: dict[str, Any] = {
        "type": "Feature",
        "properties": {"name": "demo region across two scenes"},
        "geometry": mapping(polygon),
    }
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}, indent=1))


def _write_marker(result: DemoResult, config: DemoConfig) -> None:
    summary = {
        "state": "done",
        "elapsed_s": round(result.elapsed_s, 1),
        "store": result.store.url,
        "chips": result.store.summary.num_chips,
        "report": str(result.report.html),
        "model": str(result.model_path),
        "map": result.prediction.out,
        "pixel_accuracy": result.evaluation.pixel_accuracy,
        "held_out_pixel_accuracy": result.held_out.pixel_accuracy,
        "held_out_mean_iou": result.held_out.mean_iou,
        "accuracy_floor": config.accuracy_floor,
    }
    (result.out_dir / DEMO_MARKER).write_text(json.dumps(summary, indent=1))
