"""Window edge and overlap: seam agreement, window pixels per map pixel and the model's rate.

For each model and scene, and each (window, overlap) pair, ours (`predict_region`, onnxruntime
fp32, predict's default blocks) is compared with whole-image inference of the same model
(`bench_peers.reference_classes`): the share of the valid pixels within 16 px of an interior
edge of ours' windows whose class is the same (the done-when measure of `bench_peers.py`), and
the window pixels computed per map pixel (windows run x window² / the scene's pixels: the
overlap and the windows run twice at block rows). Neither depends on the machine's load. The
model's rate: CPU seconds of onnxruntime per million window pixels, on one batch per window
edge (the pixels of ONNX_CPU_BATCH_PIXELS), best of 3.

Scenes: the synthetic 4,096 px scene of `bench_peers.py` (seed 11); a real NAIP file of
tests/data/naip-real, mirror-tiled to `--real-px` (its pixels at the model's 1 m, each copy
flipped so that the imagery runs on across the joins); with `--chesapeake DIR`, the eight real
256 px patches of ../shared/data/chesapeake-wv laid 4 x 2 and mirror-tiled the same way, and
that mosaic under a leaf-off radiometric shift (`shifts.season_histogram`).

Models: `--models A.pt B.pt` (landcover model files), or small_unet and unet_resnet18 trained
as `bench_peers.py` trains them, for `--train-steps` (95 and 131: what its 90 s gave each on an
idle machine; a count of steps, since a loaded machine makes fewer in 90 s, and a model that has
learnt little says little about seams). `--work DIR` keeps the models and scenes for a rerun.

Usage: python benchmarks/bench_windows.py [--models PT ...] [--chesapeake DIR] [--work DIR]
       [--pairs 256/64 512/128 ...] [--synthetic-px 4096] [--real-px 2048] [--json PATH]
       [--only-models NAME ...] [--scenes NAME ...] [--no-rate]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bench_peers
import numpy as np
import numpy.typing as npt
import rasterio
import torch
from affine import Affine
from bench_peers import _predict_scene, prepare_models, reference_classes, valid_pixels
from machine import load_average
from shifts import season_histogram

from landcover.prediction.backends.onnxcache import cached_onnx
from landcover.prediction.blend import window_starts
from landcover.prediction.choices import ONNX_CPU_BATCH_PIXELS
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.runtime import load_window_model

EDGE_PX = 16
PAIRS = ("256/64", "512/64", "512/96", "512/128", "768/128", "1024/128")
REAL_NAIP = Path(__file__).resolve().parents[1] / "tests/data/naip-real"
REAL_FILE = "m_4112001_sw_10_060_20220716.tif"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--chesapeake", default=None)
    parser.add_argument("--pairs", nargs="*", default=list(PAIRS))
    parser.add_argument("--synthetic-px", type=int, default=4096)
    parser.add_argument("--real-px", type=int, default=2048)
    parser.add_argument(
        "--train-steps",
        type=int,
        nargs=2,
        default=[95, 131],
        help="steps of small_unet and unet_resnet18 (bench_peers.py's 90 s on an idle machine)",
    )
    parser.add_argument("--scenes", nargs="*", default=None, help="only these scene names")
    parser.add_argument("--only-models", nargs="*", default=None, help="only these model names")
    parser.add_argument("--no-rate", action="store_true", help="skip the model-rate table")
    parser.add_argument("--json", default=None)
    parser.add_argument("--work", default=None, help="keep models and scenes here (reused)")
    args = parser.parse_args()
    pairs = [tuple(int(v) for v in p.split("/")) for p in args.pairs]
    with tempfile.TemporaryDirectory(prefix="bench_windows_") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        trained = {n: work / f"{n}.pt" for n in ("small_unet", "unet_resnet18")}
        models: dict[str, str] = {}
        if not args.models and all(p.exists() for p in trained.values()):
            models = {n: str(p) for n, p in trained.items()}
        elif args.models:
            for path in map(Path, args.models):
                for f in path.parent.glob(f"{path.stem}*"):  # the file and its ONNX cache
                    if f.is_file():
                        shutil.copy(f, work / f.name)
                models[path.stem] = str(work / path.name)
        else:
            models = train_models(work, dict(zip(trained, args.train_steps, strict=True)))
        if args.only_models:
            models = {k: v for k, v in models.items() if k in args.only_models}
        for model_path in models.values():
            cached_onnx(model_path)  # the one-time export, outside every measurement
        scenes = make_scenes(work, args)
        if args.scenes:
            scenes = {k: v for k, v in scenes.items() if k in args.scenes}
        print(f"load average {load_average():.1f} at the start", flush=True)
        rows = seams(work, models, scenes, pairs)
        rates = [] if args.no_rate else model_rates(models, sorted({w for w, _ in pairs}))
        print(f"load average {load_average():.1f} at the end", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"seams": rows, "rates": rates}, indent=1))


def train_models(work: Path, steps: dict[str, int]) -> dict[str, str]:
    """`bench_peers.prepare_models` with each model trained a fixed number of steps rather
    than seconds (its recipe, `bench_peers.train_model`): on a loaded machine 90 s is a fraction
    of the steps, and a model that has learnt little says little about seams."""
    real_time: Any = getattr(bench_peers, "time")  # noqa: B009 (its module, replaced below)
    for name, count in steps.items():
        ticks = iter([0.0] + [0.0] * count + [math.inf])  # the start, then one read a step
        setattr(bench_peers, "time", SimpleNamespace(perf_counter=partial(next, ticks)))  # noqa: B010
        try:
            prepare_models(work / name, [name], train_s=1.0)
        finally:
            setattr(bench_peers, "time", real_time)  # noqa: B010
        shutil.copy(work / name / f"{name}.pt", work / f"{name}.pt")
    return {name: str(work / f"{name}.pt") for name in steps}


def make_scenes(work: Path, args: argparse.Namespace) -> dict[str, str]:
    """Scene name -> GeoTIFF path."""
    scenes = {f"synthetic {args.synthetic_px} px": _predict_scene(work, args.synthetic_px)}
    with rasterio.open(REAL_NAIP / REAL_FILE) as src:
        real, crs = src.read(), src.crs
    side = args.real_px
    scenes[f"naip-real {REAL_FILE[:13]} mirrored to {side} px"] = _write(
        work / "real.tif", mirror_tile(real, side), crs
    )
    if args.chesapeake:
        patches = [_read(p) for p in sorted(Path(args.chesapeake).glob("*_naip.tif"))]
        rows = [np.concatenate(patches[k : k + 4], axis=2) for k in (0, 4)]
        laid = np.concatenate(rows, axis=1)
        with rasterio.open(next(Path(args.chesapeake).glob("*_naip.tif"))) as src:
            crs = src.crs
        tiled = mirror_tile(laid, side)
        scenes[f"chesapeake-wv 8 patches mirrored to {side} px"] = _write(
            work / "wv.tif", tiled, crs
        )
        scenes[f"chesapeake-wv, leaf-off shift, {side} px"] = _write(
            work / "wv-leafoff.tif", season_histogram(tiled), crs
        )
    return scenes


def mirror_tile(pixels: npt.NDArray[np.uint8], side: int) -> npt.NDArray[np.uint8]:
    """(bands, side, side): `pixels` repeated, every other copy flipped (reflect padding)."""
    _, h, w = pixels.shape
    reps = (side // h + 2, side // w + 2)
    down = np.concatenate([pixels if k % 2 == 0 else pixels[:, ::-1] for k in range(reps[0])], 1)
    across = np.concatenate([down if k % 2 == 0 else down[:, :, ::-1] for k in range(reps[1])], 2)
    return np.ascontiguousarray(across[:, :side, :side])


def _read(path: Path) -> npt.NDArray[np.uint8]:
    with rasterio.open(path) as src:
        out: npt.NDArray[np.uint8] = src.read()
        return out


def _write(path: Path, pixels: npt.NDArray[np.uint8], crs: Any) -> str:
    bands, h, w = pixels.shape
    transform = Affine(1.0, 0, 500_000.0, 0, -1.0, 4_000_000.0)  # 1 m, the models' pixel
    profile = dict(driver="GTiff", width=w, height=h, count=bands, dtype="uint8", crs=crs,
                   transform=transform, tiled=True)  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(pixels)
    return str(path)


def seams(
    work: Path, models: dict[str, str], scenes: dict[str, str], pairs: list[tuple[int, ...]]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    print(f"| model | scene | window/overlap | windows | window px per map px | agreement "
          f"within {EDGE_PX} px of window edges | elsewhere | CPU s |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|", flush=True)
    for name, model in models.items():
        for scene, image in scenes.items():
            reference = reference_classes(model, image)
            valid = valid_pixels(image)
            height, width = reference.shape
            for size, overlap in pairs:
                out = work / f"out-{name}-{size}-{overlap}.tif"
                config = PredictConfig(
                    model, (image,), str(out), device="cpu", overwrite=True, progress=False,
                    backend="onnxruntime", window=str(size), overlap_px=overlap,
                )  # fmt: skip
                started = time.process_time()
                result = predict_region(config)
                cpu_s = time.process_time() - started
                with rasterio.open(out) as src:
                    ours = src.read(1)
                near = near_edges(height, width, size, overlap)
                same = ours == reference
                row = {
                    "model": name, "scene": scene, "window": size, "overlap": overlap,
                    "windows": result.windows,
                    "pixels_per_px": result.windows * size * size / (height * width),
                    "seam": float(same[near & valid].mean()) if (near & valid).any() else None,
                    "elsewhere": float(same[~near & valid].mean()),
                    "cpu_s": cpu_s,
                }  # fmt: skip
                rows.append(row)
                seam = "–" if row["seam"] is None else f"{row['seam']:.4f}"
                print(f"| {name} | {scene} | {size}/{overlap} | {result.windows} | "
                      f"{row['pixels_per_px']:.3f} | {seam} | {row['elsewhere']:.4f} | "
                      f"{cpu_s:.0f} |", flush=True)  # fmt: skip
    return rows


def near_edges(height: int, width: int, size: int, overlap: int) -> npt.NDArray[np.bool_]:
    """Pixels within EDGE_PX of an interior edge of the windows (not the scene's border)."""

    def near_1d(length: int) -> npt.NDArray[np.bool_]:
        starts = window_starts(length, size, overlap)
        edges = {s for s in starts if s > 0} | {s + size for s in starts if s + size < length}
        idx = np.arange(length) + 0.5
        out = np.zeros(length, dtype=bool)
        for e in edges:
            out |= np.abs(idx - e) <= EDGE_PX
        return out

    return near_1d(height)[:, None] | near_1d(width)[None, :]


def model_rates(models: dict[str, str], sizes: list[int]) -> list[dict[str, Any]]:
    """CPU and wall seconds of onnxruntime per million window pixels, per window edge."""
    rows = []
    print()
    print("| model | window | windows a batch | CPU s / Mpx | wall s / Mpx | threads |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for name, path in models.items():
        model, meta = load_window_model(path, backend="onnxruntime", device=torch.device("cpu"))
        for size in sizes:
            count = max(1, ONNX_CPU_BATCH_PIXELS // (size * size))
            x = torch.randn(count, len(meta.band_mean), size, size)
            model(x)  # warm-up: onnxruntime plans the shape once
            best_cpu, best_wall = float("inf"), float("inf")
            for _ in range(3):
                c0, w0 = time.process_time(), time.perf_counter()
                model(x)
                best_cpu = min(best_cpu, time.process_time() - c0)
                best_wall = min(best_wall, time.perf_counter() - w0)
            mpx = count * size * size / 1e6
            row = {"model": name, "window": size, "batch": count,
                   "cpu_s_per_mpx": best_cpu / mpx, "wall_s_per_mpx": best_wall / mpx,
                   "threads": torch.get_num_threads()}  # fmt: skip
            rows.append(row)
            print(f"| {name} | {size} | {count} | {row['cpu_s_per_mpx']:.2f} | "
                  f"{row['wall_s_per_mpx']:.2f} | {row['threads']} |", flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
