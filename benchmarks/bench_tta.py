"""Test-time augmentation and ONNX inference: what they change and what they cost.

A small_unet is trained briefly with `landcover train` (the library's `train`, one process) on
two synthetic scenes tiled into a chip store, then predicts a third, held-out scene:
1. with `--tta none`, `flips` and `d4`: held-out pixel accuracy and mIoU against the scene's
   labels, and the prediction time of each relative to `none`;
2. exported to ONNX and run with onnxruntime, and exported to TorchScript: the share of
   pixels whose class agrees with PyTorch's, and the time relative to PyTorch's.

Give `--model`, `--scene` and `--truth` to measure another model instead (e.g. the demo's:
`--model demo-output/scaling/workers-2/model.pt`, the held-out scene of demo-output/data).

Usage: python benchmarks/bench_tta.py [--scene-px 384] [--epochs 6]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio

from landcover.evaluation import EvaluateConfig, evaluate_prediction
from landcover.models.export import export_model
from landcover.prediction.runner import PredictConfig, predict_region
from landcover.training import train
from landcover.training.config import TrainConfig
from tiling.synth import SynthConfig, synthesize_scenes
from tiling.tile import TileConfig, tile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene-px", type=int, default=384, help="synthetic scene edge")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--model", default=None, help="a model.pt instead of training one")
    parser.add_argument("--scene", default=None, help="held-out image for --model")
    parser.add_argument("--truth", default=None, help="its label raster")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_tta_") as tmp:
        work = Path(tmp)
        if args.model:
            if not (args.scene and args.truth):
                parser.error("--model needs --scene and --truth")
            model, scene, truth = args.model, args.scene, args.truth
            print(f"# bench_tta — {model} on {scene} ({_machine()})")
        else:
            started = time.perf_counter()
            model, scene, truth = _train_small_unet(work, args.scene_px, args.epochs)
            print(
                f"# bench_tta — small_unet trained {args.epochs} epochs "
                f"({time.perf_counter() - started:.0f} s) on 2 synthetic {args.scene_px} px "
                f"scenes, tested on a third ({_machine()})"
            )
        print()
        tta_table(work, model, scene, truth)
        print()
        runtime_table(work, model, scene)


def tta_table(work: Path, model: str, scene: str, truth: str) -> None:
    rows = []
    for mode in ("none", "flips", "d4"):
        out = work / f"tta-{mode}.tif"
        elapsed = _predict(model, scene, out, tta=mode)
        scores = evaluate_prediction(EvaluateConfig(prediction=str(out), truth=(truth,)))
        rows.append((mode, scores.pixel_accuracy, scores.mean_iou, elapsed))
    base_acc, base_miou, base_s = rows[0][1:]
    print("## Test-time augmentation on the held-out scene")
    print()
    print("| --tta | model passes | accuracy | mIoU | Δ accuracy | Δ mIoU | time s | time ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (mode, acc, miou, seconds), passes in zip(rows, (1, 4, 8), strict=True):
        print(
            f"| {mode} | {passes} | {acc:.4f} | {miou:.4f} | {acc - base_acc:+.4f} | "
            f"{miou - base_miou:+.4f} | {seconds:.2f} | {seconds / base_s:.1f}x |"
        )


def runtime_table(work: Path, model: str, scene: str) -> None:
    reference = work / "torch.tif"
    torch_s = _predict(model, scene, reference)
    classes = _read(reference)
    valid = classes > 0
    print("## Exported models against PyTorch (same scene, no TTA)")
    print()
    print("| runtime | file | pixels with PyTorch's class | time s | time ratio |")
    print("|---|---|---:|---:|---:|")
    print(f"| torch | model.pt | 1.000000 | {torch_s:.2f} | 1.0x |")
    for fmt, runtime in (("onnx", "onnxruntime"), ("torchscript", "torch")):
        exported = work / f"model.{fmt}"
        export_model(model, exported, format=fmt, overwrite=True)
        out = work / f"{fmt}.tif"
        seconds = _predict(str(exported), scene, out, runtime=runtime)
        agreement = float((_read(out) == classes)[valid].mean())
        print(
            f"| {runtime} | {exported.name} | {agreement:.6f} | {seconds:.2f} | "
            f"{seconds / torch_s:.2f}x |"
        )


def _train_small_unet(work: Path, scene_px: int, epochs: int) -> tuple[str, str, str]:
    synth = synthesize_scenes(SynthConfig(work / "data", scenes=3, size_px=scene_px, seed=5))
    store = str(work / "chips.zarr")
    tile(
        TileConfig(
            images=tuple(str(p) for p in synth.image_paths[:2]),
            labels=tuple(str(p) for p in synth.label_paths[:2]),
            out=store,
            chip_size=64,
            shard_size=32,
            val_fraction=0.2,
            workers=1,
        )
    )
    config = TrainConfig(
        store_url=store,
        out_dir=str(work / "run"),
        model="small_unet",
        epochs=epochs,
        batch_size=16,
        device="cpu",
        seed=0,
    )
    train(config)
    return str(work / "run" / "model.pt"), str(synth.image_paths[2]), str(synth.label_paths[2])


def _predict(
    model: str, scene: str, out: Path, *, tta: str = "none", runtime: str = "auto"
) -> float:
    """Seconds of one prediction of `scene` (best of two: the first also warms caches)."""
    best = float("inf")
    for _ in range(2):
        config = PredictConfig(
            model,
            (scene,),
            str(out),
            device="cpu",
            tta=tta,
            runtime=runtime,
            overwrite=True,
            progress=False,
        )
        started = time.perf_counter()
        predict_region(config)
        best = min(best, time.perf_counter() - started)
    return best


def _read(path: Path) -> np.ndarray:
    with rasterio.open(path) as ds:
        data: np.ndarray = ds.read(1)
    return data


def _machine() -> str:
    import torch

    return (
        f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    main()
