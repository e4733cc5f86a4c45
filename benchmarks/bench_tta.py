"""Test-time augmentation and ONNX inference: what they change and what they cost.

A small_unet is trained briefly with `landcover train` (the library's `train`, one process) on
two synthetic scenes tiled into a chip store, then predicts a third, held-out scene:
1. with `--tta none`, `flips` and `d4`: held-out pixel accuracy and mIoU against the scene's
   labels, and the prediction time of each relative to `none`;
2. exported to ONNX and run with onnxruntime, and exported to TorchScript: the share of
   pixels whose class agrees with PyTorch's, and the time relative to PyTorch's.

Give `--model`, `--scene` and `--truth` to measure another model instead (e.g. the demo's:
`--model demo-output/scaling/workers-2/model.pt`, the held-out scene of demo-output/data).

Usage: python benchmarks/bench_tta.py [--scene-px 512] [--epochs 8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
import torch

from landcover.evaluation import EvaluateConfig, evaluate_prediction
from landcover.models.export import export_model
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.runtime import load_window_model
from landcover.prediction.tta import average_over_symmetries, tta_ops
from landcover.training import train
from landcover.training.config import TrainConfig
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

REPEATS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene-px", type=int, default=512, help="synthetic scene edge")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--model", default=None, help="a model.pt instead of training one")
    parser.add_argument("--scene", default=None, help="held-out image for --model")
    parser.add_argument("--truth", default=None, help="its label raster")
    parser.add_argument("--work", default=None, help="keep the files here [default: a temp dir]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_tta_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
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
    modes = ("none", "flips", "d4")
    runs: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    for _ in range(REPEATS):  # interleaved, best of each: the cores are shared
        for mode in modes:
            wall_s, cpu_s = _predict(model, scene, work / f"tta-{mode}.tif", tta=mode)
            runs[mode].append((wall_s, cpu_s, _model_cpu_seconds(model, mode)))
    best = {
        mode: tuple(min(column) for column in zip(*rows, strict=True))
        for mode, rows in runs.items()
    }
    base = evaluate_prediction(
        EvaluateConfig(prediction=str(work / "tta-none.tif"), truth=(truth,))
    )
    print("## Test-time augmentation on the held-out scene")
    print()
    print(
        f"CPU seconds (best of {REPEATS}, interleaved; wall time on shared cores is noisier): "
        "the model alone on 8 batches of 16 windows, and the whole prediction of the scene."
    )
    print()
    print(
        "| --tta | model passes | accuracy | mIoU | Δ accuracy | Δ mIoU | model CPU ratio "
        "| predict CPU s | predict CPU ratio | predict wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, passes in zip(modes, (1, 4, 8), strict=True):
        scores = evaluate_prediction(
            EvaluateConfig(prediction=str(work / f"tta-{mode}.tif"), truth=(truth,))
        )
        wall_s, cpu_s, model_s = best[mode]
        print(
            f"| {mode} | {passes} | {scores.pixel_accuracy:.4f} | {scores.mean_iou:.4f} | "
            f"{scores.pixel_accuracy - base.pixel_accuracy:+.4f} | "
            f"{scores.mean_iou - base.mean_iou:+.4f} | {model_s / best['none'][2]:.1f}x | "
            f"{cpu_s:.2f} | {cpu_s / best['none'][1]:.1f}x | {wall_s:.2f} |"
        )


def runtime_table(work: Path, model: str, scene: str) -> None:
    reference = work / "torch.tif"
    files = {"torch": (model, reference)}
    for fmt in ("onnx", "torchscript"):
        exported = work / f"model.{fmt}"
        export_model(model, exported, format=fmt, overwrite=True)
        files[fmt] = (str(exported), work / f"{fmt}.tif")
    runtimes = {"torch": "torch", "onnx": "onnxruntime", "torchscript": "torch"}
    best: dict[str, tuple[float, float]] = {}
    for _ in range(REPEATS):
        for kind, (path, out) in files.items():
            wall_s, cpu_s = _predict(path, scene, out, runtime=runtimes[kind])
            old = best.get(kind, (float("inf"), float("inf")))
            best[kind] = (min(old[0], wall_s), min(old[1], cpu_s))
    classes = _read(reference)
    valid = classes > 0
    print("## Exported models against PyTorch (same scene, no TTA)")
    print()
    print("| runtime | file | pixels with PyTorch's class | predict CPU s | CPU ratio | wall s |")
    print("|---|---|---:|---:|---:|---:|")
    for kind, (path, out) in files.items():
        agreement = float((_read(out) == classes)[valid].mean())
        wall_s, cpu_s = best[kind]
        print(
            f"| {runtimes[kind]} | {Path(path).name} | {agreement:.6f} | {cpu_s:.2f} | "
            f"{cpu_s / best['torch'][1]:.2f}x | {wall_s:.2f} |"
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
) -> tuple[float, float]:
    """Wall and CPU seconds (all threads of this process) of one prediction of `scene`."""
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
    wall, cpu = time.perf_counter(), time.process_time()
    predict_region(config)
    return time.perf_counter() - wall, time.process_time() - cpu


def _model_cpu_seconds(model: str, tta: str, *, batches: int = 8) -> float:
    """CPU seconds of the model alone (with `tta`) on `batches` batches of 16 windows."""
    window_model, meta = load_window_model(model, device=torch.device("cpu"))
    size = meta.chip_size
    x = torch.randn(16, meta.in_channels, size, size, generator=torch.Generator().manual_seed(0))
    average_over_symmetries(window_model, x, tta_ops(tta))  # warm-up: first-call setup
    started = time.process_time()
    for _ in range(batches):
        average_over_symmetries(window_model, x, tta_ops(tta))
    return time.process_time() - started


def _read(path: Path) -> np.ndarray:
    with rasterio.open(path) as ds:
        data: np.ndarray = ds.read(1)
    return data


def _machine() -> str:
    return (
        f"{os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_tta.py"):
        main()
