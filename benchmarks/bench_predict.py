"""Prediction benchmark: throughput, flat memory, and seams — ours vs simple baselines.

1. Throughput (km² per minute at 1 m) of `predict_region` for `small_unet` and
   `unet_resnet18` on synthetic NAIP-like scenes, next to the model's own forward speed on
   non-overlapping chips (the machine limit for that model: no I/O, no overlap, no blending).
   Also with `--overlap 0` to show what the seamless overlap costs. On CUDA too if present.
2. Peak RSS of a prediction subprocess for a region 1x and 16x the area (same block size).
3. Seams: a small_unet trained here for a short time on synthetic scenes predicts a held-out
   scene (a) with ours (overlapping windows, smooth blending) and (b) with a naive predictor
   (non-overlapping chips, each run alone). Accuracy against the labels for pixels within
   16 px of a window edge vs the interior, and agreement with full-image inference (the model
   run on the whole scene at once) for the same two groups.

Usage: python benchmarks/bench_predict.py [--quick] [--train-seconds S]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from affine import Affine

from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from landcover.prediction.blend import window_starts
from landcover.prediction.runner import PredictConfig, predict_region
from tiling.classes import get_class_map
from tiling.synth import SynthConfig, synthesize_scenes

CHIP = 256
EDGE_PX = 16
CLASS_MAP = get_class_map("chesapeake7to5")
BANDS = ("red", "green", "blue", "nir")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    parser.add_argument("--train-seconds", type=float, default=None)
    args = parser.parse_args()
    quick = args.quick
    train_s = args.train_seconds if args.train_seconds is not None else (20.0 if quick else 75.0)
    with tempfile.TemporaryDirectory(prefix="bench_predict_") as tmp:
        work = Path(tmp)
        print(f"# bench_predict ({'quick' if quick else 'full'}) — {_machine()}")
        print()
        throughput(work, side_px=512 if quick else 1024, repeats=2 if quick else 3)
        print()
        memory(work, base_px=512 if quick else 768, block_px=256, batch=4)
        print()
        seams(work, scene_px=512 if quick else 1024, train_s=train_s)


# -- 1. throughput -------------------------------------------------------------------------------


def throughput(work: Path, *, side_px: int, repeats: int) -> None:
    scenes = synthesize_scenes(SynthConfig(work / "tp", scenes=1, size_px=side_px, seed=11))
    image = str(scenes.image_paths[0])
    km2 = side_px * side_px / 1e6
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"## Throughput at 1 m: one {side_px} x {side_px} px scene ({km2:.2f} km²), chip {CHIP}")
    print()
    print(
        f"Best of {repeats} interleaved runs each (the machine is shared; best = least disturbed)."
    )
    print()
    print("| model | device | ours km²/min | ours, overlap 0 | model alone | ours / model alone |")
    print("|---|---|---:|---:|---:|---:|")
    for name in ("small_unet", "unet_resnet18"):
        model_path = work / f"{name}.pt"
        net = build_model(name, num_classes=CLASS_MAP.num_classes)
        _save(model_path, net, name, (110.0,) * 4, (60.0,) * 4)
        for device in devices:
            configs = [
                PredictConfig(
                    str(model_path),
                    (image,),
                    str(work / f"tp-{name}-{device}.tif"),
                    overlap_px=overlap,
                    device=device,
                    overwrite=True,
                    progress=False,
                )
                for overlap in (None, 0)
            ]
            best = [math.inf, math.inf, math.inf]
            for _ in range(repeats + 1):  # the first round warms up (allocations, autotune)
                for k, config in enumerate(configs):
                    started = time.perf_counter()
                    predict_region(config)
                    best[k] = min(best[k], time.perf_counter() - started)
                best[2] = min(best[2], _forward_seconds(net, device, side_px))
            rates = [km2 / (t / 60) for t in best]
            print(
                f"| {name} | {device} | {rates[0]:.2f} | {rates[1]:.2f} | {rates[2]:.2f} | "
                f"{rates[0] / rates[2]:.2f} |"
            )
    print()
    print(
        "ours: `predict_region` end to end (read, normalise, default overlap chip/4 = 64 px with "
        "sin² blending, argmax, tiled GTiff, COG). Model alone: forward passes over the same "
        "area in non-overlapping chips, batch 16, nothing else: the machine limit for the model."
    )


def _forward_seconds(net: torch.nn.Module, device: str, side_px: int) -> float:
    model = net.eval().to(device)
    chips = math.ceil(side_px / CHIP) ** 2
    x = torch.randn(min(chips, 16), 4, CHIP, CHIP, device=device)
    with torch.inference_mode():
        _sync(device)
        started = time.perf_counter()
        done = 0
        while done < chips:
            model(x[: min(len(x), chips - done)])
            done += len(x)
        _sync(device)
    return time.perf_counter() - started


# -- 2. memory -----------------------------------------------------------------------------------

_CHILD = r"""
import json, sys, threading, time
import psutil
from landcover.prediction.runner import PredictConfig, predict_region
from landcover.models.modelfile import load_model_file
model, image, out = sys.argv[1], sys.argv[2], sys.argv[3]
block, batch = int(sys.argv[4]), int(sys.argv[5])
load_model_file(model)  # imports and one model: what every run holds before predicting
proc = psutil.Process()
start = proc.memory_info().rss
peak = [start]
done = threading.Event()
def sample():
    while not done.wait(0.01):
        peak[0] = max(peak[0], proc.memory_info().rss)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
t = time.perf_counter()
predict_region(PredictConfig(model, (image,), out, block_px=block, batch_size=batch,
                             device="cpu", overwrite=True, progress=False))
seconds = time.perf_counter() - t
done.set()
thread.join()
peak[0] = max(peak[0], proc.memory_info().rss)
print(json.dumps({"start": start, "peak": peak[0], "seconds": seconds}))
"""


def memory(work: Path, *, base_px: int, block_px: int, batch: int) -> None:
    """Peak RSS for a region of base_px² and 16x that; the 1x region already spans several
    blocks and full batches, so both runs hold the same buffers: any growth is the region's."""
    model_path = work / "mem.pt"
    _save(
        model_path,
        build_model("small_unet", num_classes=CLASS_MAP.num_classes),
        "small_unet",
        (110.0,) * 4,
        (60.0,) * 4,
    )
    rows = []
    for factor in (1, 16):
        side = base_px * int(math.sqrt(factor))
        image = _blocky_image(work / f"mem-{factor}.tif", side)
        out = work / f"mem-{factor}-out.tif"
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, *map(str, (model_path, image, out, block_px, batch))],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append((factor, side, json.loads(done.stdout.strip().splitlines()[-1])))
    print(
        f"## Peak RSS, small_unet, block {block_px} px, batch {batch} (one subprocess per region)"
    )
    print()
    print(
        "RSS sampled every 10 ms with psutil in the child; 'start' = after imports and model load."
    )
    print()
    print("| region | px | km² at 1 m | start MiB | peak MiB | peak - start MiB | s | peak vs 1x |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = rows[0][2]["peak"]
    mib = 1024 * 1024
    for factor, side, r in rows:
        print(
            f"| {factor}x | {side} x {side} | {side * side / 1e6:.2f} | {r['start'] / mib:.0f} | "
            f"{r['peak'] / mib:.0f} | {(r['peak'] - r['start']) / mib:.0f} | "
            f"{r['seconds']:.1f} | {r['peak'] / base:.3f} |"
        )
    print()
    print("Goal: the 16x peak within 10% of the 1x peak (ratio <= 1.10).")


def _blocky_image(path: Path, side: int) -> Path:
    rng = np.random.default_rng(side)
    profile = dict(
        driver="GTiff",
        width=side,
        height=side,
        count=4,
        dtype="uint8",
        crs="EPSG:26918",
        transform=Affine(1.0, 0, 370_000.0, 0, -1.0, 4_300_000.0),
        tiled=True,
        blockxsize=512,
        blockysize=512,
        compress="deflate",
        zlevel=1,
    )
    with rasterio.open(path, "w", **profile) as dst:
        for row0 in range(0, side, 512):
            h = min(512, side - row0)
            coarse = rng.integers(20, 230, size=(4, h // 8 + 1, side // 8 + 1), dtype=np.uint8)
            block = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)[:, :h, :side]
            dst.write(block, window=rasterio.windows.Window(0, row0, side, h))
    return path


# -- 3. seams ------------------------------------------------------------------------------------


def seams(work: Path, *, scene_px: int, train_s: float) -> None:
    synth = synthesize_scenes(SynthConfig(work / "seam", scenes=3, size_px=scene_px, seed=5))
    images = [_read(p) for p in synth.image_paths]
    labels = [CLASS_MAP.apply(_read(p)[0], nodata=15) for p in synth.label_paths]
    train_images, train_labels = images[:2], labels[:2]
    test_image, test_labels = images[2], labels[2]
    stack = np.stack(train_images).astype(np.float64)
    mean = tuple(float(v) for v in stack.mean(axis=(0, 2, 3)))
    std = tuple(float(v) for v in stack.std(axis=(0, 2, 3)))
    model, steps, loss = _train(train_images, train_labels, mean, std, train_s)
    model_path = work / "seam.pt"
    _save(model_path, model, "small_unet", mean, std)
    out = work / "seam-ours.tif"
    predict_region(
        PredictConfig(
            str(model_path), (str(synth.image_paths[2]),), str(out), device="cpu", progress=False
        )
    )
    ours = _read(out)[0]
    x = _normalise(test_image, mean, std)
    naive = _naive_chips(model, x)
    with torch.inference_mode():
        full = (model(torch.from_numpy(x)[None])[0, 1:].argmax(0) + 1).numpy().astype(np.uint8)
    predicted = ours > 0  # ours leaves the image's own nodata pixels empty; compare elsewhere
    labelled = (test_labels > 0) & predicted
    near_naive = _near_edges(scene_px, window_starts(scene_px, CHIP, 0))
    near_ours = _near_edges(scene_px, window_starts(scene_px, CHIP, CHIP // 4))
    print(
        f"## Seams: small_unet trained {train_s:.0f} s here ({steps} steps, final loss {loss:.3f}) "
        f"on 2 synthetic {scene_px} px scenes, tested on a third"
    )
    print()
    print(
        f"Edge pixels: within {EDGE_PX} px of an interior window edge of that predictor's windows."
    )
    print()
    print(
        "| predictor | accuracy near edges | accuracy interior | near / interior "
        "| agreement with full-image near edges | interior | near / interior |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, pred, near in [
        ("ours: overlap 64 px, blended", ours, near_ours),
        ("naive: chips side by side", naive, near_naive),
        ("full-image inference (reference)", full, near_naive),
    ]:
        acc_near = _share(pred == test_labels, near & labelled)
        acc_int = _share(pred == test_labels, ~near & labelled)
        agr_near = _share(pred == full, near & predicted)
        agr_int = _share(pred == full, ~near & predicted)
        print(
            f"| {name} | {acc_near:.4f} | {acc_int:.4f} | {acc_near / acc_int:.3f} | "
            f"{agr_near:.4f} | {agr_int:.4f} | {agr_near / agr_int:.3f} |"
        )
    # The same pixels for both predictors: those near the naive chip edges.
    on = near_naive & predicted
    print()
    print(
        f"On the naive predictor's edge pixels ({near_naive.mean():.1%} of the scene): "
        f"agreement with full-image inference ours {_share(ours == full, on):.4f}, "
        f"naive {_share(naive == full, on):.4f}; accuracy ours "
        f"{_share(ours == test_labels, on & labelled):.4f}, "
        f"naive {_share(naive == test_labels, on & labelled):.4f}."
    )


def _train(
    images: list[npt.NDArray[np.uint8]],
    labels: list[npt.NDArray[np.uint8]],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    seconds: float,
) -> tuple[torch.nn.Module, int, float]:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build_model("small_unet", num_classes=CLASS_MAP.num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xs = [torch.from_numpy(_normalise(im, mean, std)) for im in images]
    ys = [torch.from_numpy(lab.astype(np.int64)) for lab in labels]
    crop, batch = 128, 8
    started, steps, loss_value = time.perf_counter(), 0, float("nan")
    model.train()
    while time.perf_counter() - started < seconds:
        bx, by = [], []
        for _ in range(batch):
            k = int(rng.integers(len(xs)))
            r = int(rng.integers(xs[k].shape[1] - crop))
            c = int(rng.integers(xs[k].shape[2] - crop))
            bx.append(xs[k][:, r : r + crop, c : c + crop])
            by.append(ys[k][r : r + crop, c : c + crop])
        logits = model(torch.stack(bx))
        loss = torch.nn.functional.cross_entropy(logits, torch.stack(by), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        steps += 1
        value = float(loss.detach())
        loss_value = 0.9 * loss_value + 0.1 * value if steps > 1 else value
    return model.eval(), steps, loss_value


def _naive_chips(model: torch.nn.Module, x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Each chip predicted alone, chips side by side (the last one flush with the edge)."""
    h, w = x.shape[1:]
    out = np.zeros((h, w), dtype=np.uint8)
    with torch.inference_mode():
        for r in window_starts(h, CHIP, 0):
            for c in window_starts(w, CHIP, 0):
                chip = torch.from_numpy(np.ascontiguousarray(x[:, r : r + CHIP, c : c + CHIP]))
                pred = model(chip[None])[0, 1:].argmax(0) + 1
                out[r : r + CHIP, c : c + CHIP] = pred.numpy()
    return out


def _near_edges(side: int, starts: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    """Pixels within EDGE_PX of an interior window edge (the scene border is not a seam)."""
    edges = sorted({s for s in starts if s > 0} | {s + CHIP for s in starts if s + CHIP < side})
    idx = np.arange(side)
    near_1d = np.zeros(side, dtype=bool)
    for e in edges:
        near_1d |= np.abs(idx + 0.5 - e) <= EDGE_PX
    return near_1d[:, None] | near_1d[None, :]


def _share(hit: npt.NDArray[np.bool_], where: npt.NDArray[np.bool_]) -> float:
    return float(hit[where].mean()) if where.any() else float("nan")


def _normalise(
    image: npt.NDArray[np.uint8], mean: tuple[float, ...], std: tuple[float, ...]
) -> npt.NDArray[np.float32]:
    m = np.asarray(mean, dtype=np.float32)[:, None, None]
    s = np.asarray(std, dtype=np.float32)[:, None, None]
    return ((image.astype(np.float32) - m) / s).astype(np.float32)


# -- helpers -------------------------------------------------------------------------------------


def _save(
    path: Path, model: torch.nn.Module, name: str, mean: tuple[float, ...], std: tuple[float, ...]
) -> None:
    meta = ModelMeta(name, CLASS_MAP, BANDS, mean, std, chip_size=CHIP, resolution_m=1.0)
    save_model_file(path, model, meta)


def _read(path: Path) -> npt.NDArray[np.uint8]:
    with rasterio.open(path) as ds:
        out: npt.NDArray[np.uint8] = ds.read()
        return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _machine() -> str:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), {gpu}, load average {load:.1f} at start"
    )


if __name__ == "__main__":
    main()
