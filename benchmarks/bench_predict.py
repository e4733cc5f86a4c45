"""Prediction benchmark: throughput, flat memory, and seams — ours vs simple baselines.

1. Throughput of `predict_region` for `small_unet` and `unet_resnet18` on a synthetic
   NAIP-like scene next to the model's own forward speed (the machine limit for that model: no
   I/O, no blending), on the same work: (a) without overlap on the same non-overlapping
   chips, (b) with the default overlap on as many windows as ours ran; and (c) km² per minute
   with the default overlap against the model on non-overlapping chips (what a user pays for
   seamless output; capped by the overlap). On CUDA too if present.
   Then where the time goes: seconds per stage (read, normalise, infer, blend, argmax, write,
   COG) of one run in one thread and pipelined.
2. RSS (median, 95th percentile, peak) of a prediction subprocess for a region 1x and 16x the
   area (same block size), and of each rank of a 2-rank job on regions 4x those; each run 3
   times.
3. Seams: a small_unet trained here for a short time on synthetic scenes predicts a held-out
   scene (a) with ours (overlapping windows, smooth blending) and (b) with a naive predictor
   (non-overlapping chips, each run alone). Accuracy against the labels for pixels within
   16 px of a window edge vs the interior, and agreement with full-image inference (the model
   run on the whole scene at once) for the same two groups.
4. Backends and precisions (`--only backends`): for small_unet and unet_resnet18 (smp's Unet
   on resnet18, random weights), each backend (torch eager, onnxruntime through the cached
   ONNX export) and precision (fp32; bf16 where the CPU has it; int8 through onnxruntime's
   static quantization, calibrated on a store tiled from the scene, where the CPU has VNNI)
   side by side in one run:
   km²/min of `predict_region` end to end against the same backend and precision running
   only the forward passes on pre-made batches of the sizes ours ran (the machine's limit for
   that choice), and each against torch eager fp32; the one-time export's (and
   quantization's) seconds; then the class agreement with torch fp32 and the accuracy of a
   small_unet trained here on synthetic scenes, and with `--data DIR` (the real labelled
   patches of ../shared/data/chesapeake-wv) of a small_unet trained with `landcover train` on
   6 of the 8 real patches and tested on the other 2 (int8 calibrated on its training store).

Usage: python benchmarks/bench_predict.py [--quick] [--train-seconds S] [--only SECTION ...]
           [--data ../shared/data/chesapeake-wv]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from affine import Affine
from machine import load_average

import landcover.prediction.windows as prediction_windows
from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from landcover.prediction.backends import cpu_features
from landcover.prediction.backends.onnxcache import cached_onnx
from landcover.prediction.blend import window_starts
from landcover.prediction.choices import Backend, Precision
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.runtime import load_window_model
from landcover.training.distributed import cpu_model_name
from tiling.sources.classes import get_class_map
from tiling.synthetic.scenes import SynthConfig, SynthResult, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

CHIP = 256
OVERLAP = CHIP // 4  # predict's default
EDGE_PX = 16
CLASS_MAP = get_class_map("chesapeake7to5")
BANDS = ("red", "green", "blue", "nir")
SECTIONS = ["throughput", "profile", "memory", "seams", "backends", "windows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    parser.add_argument("--train-seconds", type=float, default=None)
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=SECTIONS, help="run only these sections"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="the real labelled patches (../shared/data/chesapeake-wv): --only backends then "
        "measures agreement and accuracy on them too",
    )
    args = parser.parse_args()
    quick = args.quick
    train_s = args.train_seconds if args.train_seconds is not None else (20.0 if quick else 75.0)
    with tempfile.TemporaryDirectory(prefix="bench_predict_") as tmp:
        work = Path(tmp)
        print(f"# bench_predict ({'quick' if quick else 'full'}) — {_machine()}")
        if "throughput" in args.only:
            print()
            side = 2048 if quick else 4096  # 4 blocks; the full run's are predict's default
            throughput(work, side_px=side, block_px=side // 2, repeats=2 if quick else 3)
        if "profile" in args.only:
            print()
            side = 2048 if quick else 4096
            stage_profile(work, side_px=side, block_px=side // 2)
        if "memory" in args.only:
            print()
            memory(
                work, base_px=512 if quick else 768, block_px=256, batch=4, repeat=1 if quick else 3
            )
        if "seams" in args.only:
            print()
            seams(work, scene_px=512 if quick else 1024, train_s=train_s)
        if "windows" in args.only:
            print()
            window_sizes(
                work, scene_px=(1024, 1536) if quick else (2048, 3072), steps=150 if quick else 400
            )
        if "backends" in args.only:
            print()
            backends(work, side_px=2048 if quick else 4096, block_px=1024 if quick else 2048)
            print()
            backend_agreement(work, scene_px=512 if quick else 1024, steps=150 if quick else 400)
            if args.data is not None:
                print()
                real_patch_agreement(work, args.data, epochs=5 if quick else 20)


# -- 1. throughput -------------------------------------------------------------------------------


def throughput(work: Path, *, side_px: int, block_px: int, repeats: int) -> None:
    """Ours end to end vs the model alone on the same work, three ways (see the printed notes).

    Blocks of `block_px` (half the scene's side: four blocks; the full run's are predict's
    default 2048 px), as a state has thousands: with one block there is nothing to overlap.
    """
    scenes = synthesize_scenes(SynthConfig(work / "tp", scenes=1, size_px=side_px, seed=11))
    image = str(scenes.image_paths[0])
    km2 = side_px * side_px / 1e6
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"## Throughput at 1 m: one {side_px} x {side_px} px scene ({km2:.2f} km²), chip {CHIP}, "
        f"{math.ceil(side_px / block_px) ** 2} blocks of {block_px} px"
    )
    print()
    print(
        f"Best of {repeats} interleaved runs each (the machine may be shared; best = least "
        f"disturbed). torch runs {torch.get_num_threads()} intra-op threads in ours and in the "
        "model-alone loop (one process, one setting)."
    )
    print()
    print(
        "| model | device | windows at overlap 0 / 64 "
        "| (a) overlap 0, km²/min: ours / model alone "
        "| (b) overlap 64, windows/s: ours / model alone "
        "| (c) km²/min: ours at 64 / model alone at 0 |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name in ("small_unet", "unet_resnet18"):
        model_path = work / f"{name}.pt"
        net = build_model(name, num_classes=CLASS_MAP.num_classes)
        _save(model_path, net, name, (110.0,) * 4, (60.0,) * 4)
        for device in devices:
            configs = {
                overlap: PredictConfig(
                    str(model_path),
                    (image,),
                    str(work / f"tp-{name}-{device}.tif"),
                    overlap_px=overlap,
                    block_px=block_px,
                    device=device,
                    backend="torch",  # the model alone below is torch's forward
                    overwrite=True,
                    progress=False,
                )
                for overlap in (0, OVERLAP)
            }
            ours = {overlap: math.inf for overlap in configs}
            alone = {overlap: math.inf for overlap in configs}
            windows = {overlap: 0 for overlap in configs}
            for _ in range(repeats + 1):  # the first round warms up (allocations, autotune)
                for overlap, config in configs.items():
                    with _recorded_batches() as batches:
                        started = time.perf_counter()
                        windows[overlap] = predict_region(config).windows
                        ours[overlap] = min(ours[overlap], time.perf_counter() - started)
                    seconds = _forward_seconds(net, device, batches)
                    alone[overlap] = min(alone[overlap], seconds)
            a = (km2 / ours[0] * 60, km2 / alone[0] * 60)
            b = (windows[OVERLAP] / ours[OVERLAP], windows[OVERLAP] / alone[OVERLAP])
            c = (km2 / ours[OVERLAP] * 60, a[1])
            print(
                f"| {name} | {device} | {windows[0]} / {windows[OVERLAP]} | {_ratio(*a)} | "
                f"{_ratio(*b)} | {_ratio(*c)} |"
            )
    print()
    print(
        "ours: `predict_region` end to end (load the model, read, normalise, infer, blend with "
        "sin² weights, argmax, tiled GTiff, COG). Model alone: forward passes over random "
        "chips in the very batches ours ran (up to 16; a block's last batch is smaller), "
        "nothing else, in this process after ours, so with the malloc settings predict makes "
        "(`FreedMemory`: activations reuse heap pages; with glibc's default the model alone is "
        "about 2.5x slower). (a) and (b) compare the same work: (a) "
        "ours without overlap vs the model on the same non-overlapping chips, (b) ours with "
        "the default overlap (chip/4 = 64 px) vs the model on as many windows as ours ran. (c) "
        "is km² per minute with the default overlap against the model on non-overlapping "
        "chips: ours runs (256/192)² ≈ 1.78x the windows the area needs (fewer on a small "
        "scene, whose last windows sit flush with its edge), so (c) is capped at windows(0) / "
        "windows(64) whatever the pipeline does; it is what the overlap costs a user."
    )


def _ratio(ours: float, alone: float) -> str:
    return f"{ours:.2f} / {alone:.2f} = **{ours / alone:.2f}**"


def _forward_seconds(net: torch.nn.Module, device: str, batches: list[tuple[int, int]]) -> float:
    """Seconds for the model alone to run batches of random windows of these (count, edge)."""
    model = net.eval().to(device)
    edge = max(e for _, e in batches)
    x = torch.randn(max(n for n, _ in batches), 4, edge, edge, device=device)
    with torch.inference_mode():
        _sync(device)
        started = time.perf_counter()
        for size, window in batches:
            model(x[:size, :, :window, :window])
        _sync(device)
    return time.perf_counter() - started


@contextmanager
def _recorded_batches() -> Iterator[list[tuple[int, int]]]:
    """The batches `predict_region` hands the model, in order: (windows, window edge)."""
    sizes: list[tuple[int, int]] = []
    original = prediction_windows._run_model

    def run_model(model: Any, x: torch.Tensor, num_classes: int, where: str) -> torch.Tensor:
        sizes.append((int(x.shape[0]), int(x.shape[-1])))
        return original(model, x, num_classes, where)

    prediction_windows._run_model = run_model
    try:
        yield sizes
    finally:
        prediction_windows._run_model = original


# -- 1b. where the time goes ----------------------------------------------------------------------

# (stage, module, attribute) timed by wrapping: the stages of `predict_region`.
_STAGES = (
    ("read sources (read_mosaic)", "landcover.prediction.blockstages", "read_mosaic"),
    ("region mask", "landcover.prediction.blockstages", "region_mask"),
    (
        "prepare a block (all of the above + pick windows)",
        "landcover.prediction.intofile",
        "prepare_block",
    ),
    ("normalise", "landcover.prediction.windows", "normalise"),
    ("infer (model forward)", "landcover.prediction.windows", "_run_model"),
    ("blend (LogitBlender.add)", "landcover.prediction.blend", "LogitBlender.add"),
    (
        "run windows (cut + normalise + infer)",
        "landcover.prediction.windows",
        "WindowRunner.run",
    ),
    (
        "blend a block (add, divide, argmax, softmax)",
        "landcover.prediction.blockstages",
        "BlockBlender.__call__",
    ),
    ("write + tally (BlockWriter)", "landcover.prediction.blockstages", "BlockWriter.__call__"),
    ("block loop, wall (run_pipeline)", "landcover.prediction.intofile", "run_pipeline"),
    ("COG conversion (write_cogs)", "landcover.prediction.runner", "write_cogs"),
)


def stage_profile(work: Path, *, side_px: int, block_px: int) -> None:
    """Seconds per stage of one run, one thread (`pipeline=False`) vs pipelined."""
    scenes = synthesize_scenes(SynthConfig(work / "prof", scenes=1, size_px=side_px, seed=11))
    image = str(scenes.image_paths[0])
    print(
        f"## Where the time goes: one {side_px} x {side_px} px scene, blocks of {block_px} px, "
        f"overlap {OVERLAP}, probabilities too, CPU"
    )
    print()
    columns: list[tuple[str, dict[str, float]]] = []
    for name in ("small_unet", "unet_resnet18"):
        model_path = work / f"prof-{name}.pt"
        _save(
            model_path,
            build_model(name, num_classes=CLASS_MAP.num_classes),
            name,
            (110.0,) * 4,
            (60.0,) * 4,
        )
        for pipeline in (False, True, False, True):  # the first two warm up
            config = PredictConfig(
                str(model_path),
                (image,),
                str(work / "prof.tif"),
                probabilities=str(work / "prof-p.tif"),
                block_px=block_px,
                device="cpu",
                backend="torch",
                overwrite=True,
                progress=False,
                pipeline=pipeline,
            )
            with _timed_stages() as seconds:
                started = time.perf_counter()
                predict_region(config)
                seconds["total, wall"] = time.perf_counter() - started
            columns.append((f"{name} {'pipelined' if pipeline else 'one thread'}", seconds))
    columns = [c for k, c in enumerate(columns) if k % 4 >= 2]
    print("| stage, s | " + " | ".join(title for title, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for _, c in columns:
        c["rest: load the model, open, plan, files"] = (
            c["total, wall"]
            - c["block loop, wall (run_pipeline)"]
            - c["COG conversion (write_cogs)"]
        )
    rows = [s for s, _, _ in _STAGES] + ["rest: load the model, open, plan, files", "total, wall"]
    for stage in rows:
        print(f"| {stage} | " + " | ".join(f"{c[stage]:.2f}" for _, c in columns) + " |")
    print()
    print(
        "Seconds summed over calls, in whichever thread ran them: pipelined, reading and "
        "writing run beside the model, so the stages add up to more than the wall time."
    )


@contextmanager
def _timed_stages() -> Iterator[dict[str, float]]:
    seconds = {stage: 0.0 for stage, _, _ in _STAGES}
    lock = threading.Lock()
    restore = []
    for stage, module_name, attribute in _STAGES:
        owner: Any = importlib.import_module(module_name)
        *path, leaf = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, leaf)
        setattr(owner, leaf, _timer(original, stage, seconds, lock))
        restore.append((owner, leaf, original))
    try:
        yield seconds
    finally:
        for owner, leaf, original in restore:
            setattr(owner, leaf, original)


def _timer(function: Any, stage: str, seconds: dict[str, float], lock: threading.Lock) -> Any:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            with lock:
                seconds[stage] += time.perf_counter() - started

    return timed


# -- 2. memory -----------------------------------------------------------------------------------

_CHILD = r"""
import json, sys, threading, time
import psutil
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.models.modelfile import load_model_file
model, image, out = sys.argv[1], sys.argv[2], sys.argv[3]
block, batch, rank, world = (int(v) for v in sys.argv[4:8])
load_model_file(model)  # imports and one model: what every run holds before predicting
proc = psutil.Process()
start = proc.memory_info().rss
samples = [start]
done = threading.Event()
def sample():
    while not done.wait(0.01):
        samples.append(proc.memory_info().rss)
thread = threading.Thread(target=sample, daemon=True)
thread.start()
t = time.perf_counter()
predict_region(PredictConfig(model, (image,), out, block_px=block, batch_size=batch,
                             device="cpu", overwrite=True, progress=False),
               rank=rank, world_size=world)
seconds = time.perf_counter() - t
done.set()
thread.join()
samples.append(proc.memory_info().rss)
samples.sort()
print(json.dumps({"start": start, "peak": samples[-1], "median": samples[len(samples) // 2],
                  "p95": samples[int(0.95 * (len(samples) - 1))], "seconds": seconds}))
"""


def memory(work: Path, *, base_px: int, block_px: int, batch: int, repeat: int) -> None:
    """RSS for a region of base_px² and 16x that; the 1x region already spans several blocks
    and full batches, so both runs hold the same buffers: any growth is the region's. Then
    each rank of a 2-rank job on a region of (2 base_px)² and 16x that. Every run `repeat`
    times, interleaved: a short run's statistics vary by tens of MiB from run to run."""
    model_path = work / "mem.pt"
    _save(
        model_path,
        build_model("small_unet", num_classes=CLASS_MAP.num_classes),
        "small_unet",
        (110.0,) * 4,
        (60.0,) * 4,
    )
    runs: dict[tuple[int, int, int], list[dict[str, float]]] = {}  # (factor, side, rank)
    for _ in range(repeat):
        for world in (1, 2):
            for factor in (1, 16):
                # 2 ranks: twice the side, so that each rank's share of the 1x region is at
                # least the one-process 1x region (its buffers and GDAL's block cache as full)
                side = base_px * world * int(math.sqrt(factor))
                image = work / f"mem-{side}.tif"
                if not image.exists():
                    _blocky_image(image, side)
                out = work / f"mem-{factor}-{world}-out.tif"
                args = [model_path, image, out, block_px, batch]
                children = [  # the ranks of one job run together: rank 0 assembles the parts
                    subprocess.Popen(
                        [sys.executable, "-c", _CHILD, *map(str, [*args, rank, world])],
                        stdout=subprocess.PIPE,
                        text=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"} if world > 1 else None,
                    )
                    for rank in range(world)
                ]
                for rank, child in enumerate(children):
                    stdout, _ = child.communicate()
                    if child.returncode != 0:
                        raise SystemExit(f"the memory run of rank {rank} of {world} failed")
                    key = (factor, side, rank if world > 1 else -1)
                    runs.setdefault(key, []).append(json.loads(stdout))
    print(
        f"## RSS as the region grows, small_unet, block {block_px} px, batch {batch} (one "
        "subprocess per region using both cores, then one per rank of a 2-rank job, one "
        f"thread each); {repeat} runs each"
    )
    print()
    print(
        "RSS sampled every 10 ms with psutil in the child; 'start' = after imports and model "
        "load. The RSS of a run swings by ~100-150 MiB without drifting, so the peak (the "
        "largest sample) creeps up with the run's length; the median is the level it swings "
        "around, the 95th percentile (p95) the top of the swing. Each cell: the mean over the "
        "runs (their range); ratios are of the means."
    )
    print()
    print("| region | px | km² at 1 m | process | start MiB | median MiB | p95 MiB | peak MiB | "
          "s | median vs 1x | p95 vs 1x | peak vs 1x |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    mib = 1024 * 1024

    def mean(records: list[dict[str, float]], key: str) -> float:
        return sum(r[key] for r in records) / len(records)

    def cell(records: list[dict[str, float]], key: str) -> str:
        values = [r[key] / mib for r in records]
        return f"{mean(records, key) / mib:.0f} ({min(values):.0f}-{max(values):.0f})"

    base = {rank: records for (factor, _, rank), records in runs.items() if factor == 1}
    for (factor, side, rank), records in runs.items():
        who = "one process" if rank < 0 else f"rank {rank} of 2"
        ratios = " | ".join(
            f"{mean(records, key) / mean(base[rank], key):.3f}" for key in ("median", "p95", "peak")
        )
        print(
            f"| {factor}x | {side} x {side} | {side * side / 1e6:.2f} | {who} "
            f"| {mean(records, 'start') / mib:.0f} | {cell(records, 'median')} "
            f"| {cell(records, 'p95')} | {cell(records, 'peak')} "
            f"| {mean(records, 'seconds'):.1f} | {ratios} |"
        )
    print()
    print(
        "Goal (issue 15): the 16x RSS within 5% of the 1x RSS (ratio <= 1.05), for one process "
        "and for each rank (rank 0 also assembles the COG from the parts)."
    )


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
    *,
    steps: int | None = None,
) -> tuple[torch.nn.Module, int, float]:
    """small_unet trained for `seconds`, or for `steps` steps where given (a count that does
    not shrink when the machine is busy)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build_model("small_unet", num_classes=CLASS_MAP.num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xs = [torch.from_numpy(_normalise(im, mean, std)) for im in images]
    ys = [torch.from_numpy(lab.astype(np.int64)) for lab in labels]
    crop, batch = 128, 8
    started, done, loss_value = time.perf_counter(), 0, float("nan")
    model.train()
    while done < steps if steps is not None else time.perf_counter() - started < seconds:
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
        done += 1
        value = float(loss.detach())
        loss_value = 0.9 * loss_value + 0.1 * value if done > 1 else value
    return model.eval(), done, loss_value


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


# -- 5. window sizes -----------------------------------------------------------------------------


def window_sizes(work: Path, *, scene_px: tuple[int, ...], steps: int) -> None:
    """Larger windows at the same overlap: km²/min, windows run, and seam agreement with
    whole-image inference near the windows' edges, for a small_unet trained here, on held-out
    scenes of each size in `scene_px`, with onnxruntime (torch on the CPU runs the chip)."""
    synth = synthesize_scenes(SynthConfig(work / "win-train", scenes=2, size_px=1024, seed=5))
    images = [_read(p) for p in synth.image_paths]
    labels = [CLASS_MAP.apply(_read(p)[0], nodata=15) for p in synth.label_paths]
    stack = np.stack(images).astype(np.float64)
    mean = tuple(float(v) for v in stack.mean(axis=(0, 2, 3)))
    std = tuple(float(v) for v in stack.std(axis=(0, 2, 3)))
    model, steps, loss = _train(images, labels, mean, std, math.inf, steps=steps)
    model_path = work / "win.pt"
    _save(model_path, model, "small_unet", mean, std)
    if _onnx_installed():
        cached_onnx(str(model_path))  # the one-time export, outside the timed runs
    print(
        f"## Window sizes: small_unet trained here ({steps} steps, final loss {loss:.3f}), "
        f"onnxruntime, overlap {OVERLAP} px, blocks of 2048 px, on held-out synthetic scenes"
    )
    print()
    print(
        "| scene | --window | windows | s | km²/min | vs chip | agreement with whole-image "
        f"within {EDGE_PX} px of window edges | elsewhere |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for k, side in enumerate(scene_px):
        scene = synthesize_scenes(
            SynthConfig(work / f"win-{side}", scenes=1, size_px=side, seed=100 + k)
        )
        image = scene.image_paths[0]
        x = _normalise(_read(image), mean, std)
        with torch.inference_mode():
            full = (model(torch.from_numpy(x)[None])[0, 1:].argmax(0) + 1).numpy()
        base = math.nan
        for window in ("chip", "512", "1024"):
            size = CHIP if window == "chip" else int(window)
            out = work / f"win-{side}-{window}.tif"
            config = PredictConfig(
                str(model_path), (str(image),), str(out), device="cpu", overwrite=True,
                progress=False, backend="onnxruntime" if _onnx_installed() else "torch",
                window=window,
            )  # fmt: skip
            started = time.perf_counter()
            result = predict_region(config)
            seconds = time.perf_counter() - started
            ours = _read(out)[0]
            rate = side * side / 1e6 / seconds * 60
            base = rate if window == "chip" else base
            near = _near_window_edges(side, window_starts(side, size, OVERLAP), size)
            print(
                f"| {side} px | {window} ({size} px) | {result.windows} | {seconds:.1f} "
                f"| {rate:.2f} | {rate / base:.2f} | {_share(ours == full, near):.4f} "
                f"| {_share(ours == full, ~near):.4f} |"
            )
    print()
    print(
        "Whole-image inference: the model on the whole scene at once (torch). Window edges: "
        "the interior edges of that run's windows. The share of pixels that overlap costs "
        "falls with the window: (256/192)² = 1.78 windows' pixels a pixel at 256 px, "
        "(1024/960)² = 1.14 at 1,024 px; the windows on the boundary between two block rows "
        "run once for each, a larger share for larger windows. Load average "
        f"{load_average():.1f} at the end."
    )


def _near_window_edges(side: int, starts: tuple[int, ...], size: int) -> npt.NDArray[np.bool_]:
    """Pixels within EDGE_PX of an interior edge of windows of `size` (not the scene border)."""
    edges = sorted({s for s in starts if s > 0} | {s + size for s in starts if s + size < side})
    idx = np.arange(side)
    near_1d = np.zeros(side, dtype=bool)
    for e in edges:
        near_1d |= np.abs(idx + 0.5 - e) <= EDGE_PX
    return near_1d[:, None] | near_1d[None, :]


# -- 4. backends and precisions ------------------------------------------------------------------


def _runs() -> list[tuple[Backend, Precision]]:
    """(backend, precision) of every way a model file runs here."""
    runs: list[tuple[Backend, Precision]] = [("torch", "fp32")]
    if _onnx_installed():
        runs.append(("onnxruntime", "fp32"))
    if cpu_features().bf16:
        runs.append(("torch", "bf16"))
    if _onnx_installed() and cpu_features().int8:
        runs.append(("onnxruntime", "int8"))
    return runs


def _store(synth: SynthResult, out: Path, *, scenes: int | None = None, chip: int = CHIP) -> str:
    """A chip store tiled from the first `scenes` synthetic scenes and their labels: the
    calibration store of the int8 runs."""
    tile(
        TileConfig(
            images=tuple(str(p) for p in synth.image_paths[:scenes]),
            labels=tuple(str(p) for p in synth.label_paths[:scenes]),
            out=str(out),
            chip_size=chip,
            val_fraction=0.0,
            workers=1,
            overwrite=True,
        )
    )
    return str(out)


def _calibration(precision: str, store: str) -> str | None:
    return store if precision == "int8" else None


def _onnx_installed() -> bool:
    return all(importlib.util.find_spec(m) for m in ("onnxruntime", "onnx", "onnxscript"))


def backends(work: Path, *, side_px: int, block_px: int) -> None:
    """Ours against the model alone per backend and precision, and each against torch fp32."""
    scenes = synthesize_scenes(SynthConfig(work / "be", scenes=1, size_px=side_px, seed=11))
    image = str(scenes.image_paths[0])
    store = _store(scenes, work / "be-chips.zarr")
    km2 = side_px * side_px / 1e6
    runs = _runs()
    print(
        f"## Backends and precisions: one {side_px} x {side_px} px scene ({km2:.2f} km²), "
        f"predict's --window and --overlap (auto), blocks of {block_px} px, CPU "
        f"({cpu_features().describe()})"
    )
    print()
    print(
        "| model | backend | precision | export once, s | km²/min: ours / model alone "
        "| CPU s: model alone / ours | ours vs torch fp32 | model alone vs torch fp32 "
        "| classes = torch fp32 |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name in ("small_unet", "unet_resnet18"):
        model_path = work / f"be-{name}.pt"
        torch.manual_seed(0)
        _save(model_path, build_model(name, num_classes=CLASS_MAP.num_classes), name,
              (110.0,) * 4, (60.0,) * 4)  # fmt: skip
        export_s, quantize_s = math.nan, math.nan
        if _onnx_installed():
            started = time.perf_counter()
            cached_onnx(str(model_path))  # the one-time cost, outside the timed runs
            export_s = time.perf_counter() - started
        if ("onnxruntime", "int8") in runs:
            started = time.perf_counter()  # the one-time quantization, outside them too
            load_window_model(str(model_path), precision="int8", device=torch.device("cpu"),
                              calibration=store)  # fmt: skip
            quantize_s = time.perf_counter() - started
        results: dict[tuple[Backend, Precision], tuple[float, float, npt.NDArray[np.uint8]]] = {}
        cpu_s: dict[tuple[Backend, Precision], tuple[float, float]] = {}
        for backend, precision in runs:
            out = work / f"be-{name}-{backend}-{precision}.tif"
            config = PredictConfig(
                str(model_path), (image,), str(out), block_px=block_px, device="cpu",
                backend=backend, precision=precision, overwrite=True, progress=False,
                calibration=_calibration(precision, store),
            )  # fmt: skip
            with _recorded_batches() as batches:
                cpu_started = time.process_time()
                started = time.perf_counter()
                predict_region(config)
                ours_s = time.perf_counter() - started
                ours_cpu_s = time.process_time() - cpu_started
            alone_s, alone_cpu_s = _backend_forward_seconds(
                model_path, backend, precision, batches, calibration=_calibration(precision, store)
            )
            cpu_s[backend, precision] = (alone_cpu_s, ours_cpu_s)
            results[backend, precision] = (km2 / ours_s * 60, km2 / alone_s * 60, _read(out)[0])
        base_ours, base_alone, base_map = results["torch", "fp32"]
        for (backend, precision), (ours, alone, classes) in results.items():
            export = f"{export_s:.1f}" if backend == "onnxruntime" else "–"
            if precision == "int8":
                export += f" + {quantize_s:.1f}"
            agreement = float((classes == base_map).mean())
            alone_cpu_s, ours_cpu_s = cpu_s[backend, precision]
            print(
                f"| {name} | {backend} | {precision} | {export} | {_ratio(ours, alone)} "
                f"| {alone_cpu_s:.1f} / {ours_cpu_s:.1f} = {alone_cpu_s / ours_cpu_s:.2f} "
                f"| **{ours / base_ours:.2f}** | {alone / base_alone:.2f} | {agreement:.5f} |"
            )
    print()
    print(
        "ours: `predict_region` end to end with that --backend and --precision (read, "
        "normalise, infer, blend, argmax, COG). Model alone: the same backend and precision "
        "(`load_window_model`: the same export, the same batch padding) running only the "
        "forward passes of the batches ours ran (their windows and window edges), on random "
        "pixels made beforehand; its km²/min "
        "is the scene's area over those seconds. CPU s: the process's CPU seconds (every "
        "thread) of the two runs, which a shared machine's other work does not lengthen as "
        "it does the wall clock; ours vs torch fp32: the speed-up of that "
        "choice over predict with torch eager fp32. Export: seconds of the one-time ONNX "
        "export, cached by the model file's digest and not in the timed runs (int8: + the "
        "one-time quantization, calibrated on a store tiled from the scene). Classes: the "
        "share of the scene's pixels whose class equals torch fp32's, at each run's own "
        "windows (torch runs the chip's, onnxruntime `--window auto`'s: random weights, so "
        "near-ties are many and the layout moves them; the next tables compare a trained model "
        "at the same windows). Each run once, in this order, "
        "on a machine that may be shared: compare the ratios within a row."
    )


def _backend_forward_seconds(
    model_path: Path,
    backend: str,
    precision: str,
    batches: list[tuple[int, int]],
    *,
    calibration: str | None = None,
) -> tuple[float, float]:
    """Seconds, and the process's CPU seconds, for the model alone, run by `backend` in
    `precision`, to run batches of random normalised windows of these (count, edge) (made
    before the clock starts)."""
    model, chips = model_alone(
        str(model_path), backend, precision, batches, calibration=calibration
    )
    cpu_started = time.process_time()
    started = time.perf_counter()
    for x in chips:
        model(x)
    return time.perf_counter() - started, time.process_time() - cpu_started


def model_alone(
    model_path: str,
    backend: str,
    precision: str,
    batches: list[tuple[int, int]],
    *,
    calibration: str | None = None,
) -> tuple[Any, list[torch.Tensor]]:
    """The model run by `backend` in `precision` (`load_window_model`: predict's export and
    batch padding), warmed up, and batches of random normalised windows of these (count,
    edge): the machine's limit for a prediction that ran those batches is the model on them."""
    model, _ = load_window_model(
        model_path,
        backend=backend,
        precision=precision,
        device=torch.device("cpu"),
        calibration=calibration,
    )
    generator = torch.Generator().manual_seed(0)
    chips = [torch.randn(size, 4, edge, edge, generator=generator) for size, edge in batches]
    model(chips[0])  # warm up: the first call builds kernels, sessions and caches
    return model, chips


def backend_agreement(work: Path, *, scene_px: int, steps: int) -> None:
    """A small_unet trained here, on a held-out scene: class agreement of each backend and
    precision with torch fp32, and accuracy against the labels."""
    synth = synthesize_scenes(SynthConfig(work / "agree", scenes=3, size_px=scene_px, seed=5))
    images = [_read(p) for p in synth.image_paths]
    labels = [CLASS_MAP.apply(_read(p)[0], nodata=15) for p in synth.label_paths]
    stack = np.stack(images[:2]).astype(np.float64)
    mean = tuple(float(v) for v in stack.mean(axis=(0, 2, 3)))
    std = tuple(float(v) for v in stack.std(axis=(0, 2, 3)))
    model, steps, loss = _train(images[:2], labels[:2], mean, std, math.inf, steps=steps)
    model_path = work / "agree.pt"
    _save(model_path, model, "small_unet", mean, std)
    store = _store(synth, work / "agree-chips.zarr", scenes=2)  # int8's calibration
    print(
        f"## Agreement of the backends: small_unet trained here ({steps} steps of 8 chips of "
        f"128 px, final loss {loss:.3f}) on 2 synthetic {scene_px} px scenes, tested on a third"
    )
    print()
    print("| backend | precision | classes = torch fp32 | accuracy | accuracy − torch fp32 |")
    print("|---|---|---:|---:|---:|")
    maps = {}
    for backend, precision in _runs():
        out = work / f"agree-{backend}-{precision}.tif"
        predict_region(
            PredictConfig(
                str(model_path), (str(synth.image_paths[2]),), str(out), device="cpu",
                backend=backend, precision=precision, progress=False, window="chip",
                calibration=_calibration(precision, store),
            )
        )  # fmt: skip
        maps[backend, precision] = _read(out)[0]
    base = maps["torch", "fp32"]
    labelled = (labels[2] > 0) & (base > 0)
    base_accuracy = _share(base == labels[2], labelled)
    for (backend, precision), classes in maps.items():
        accuracy = _share(classes == labels[2], labelled)
        print(
            f"| {backend} | {precision} | {float((classes == base).mean()):.5f} "
            f"| {accuracy:.4f} | {accuracy - base_accuracy:+.4f} |"
        )
    print()
    print(
        "`--precision auto` would pick bf16 or int8 only where its classes agree with fp32 on "
        "at least 0.999 of the pixels with no loss of accuracy; it stays fp32 (landcover."
        "prediction.runtime). Every row runs the chip's windows (`--window chip`), so the "
        "table compares the backends and precisions, not window layouts. Agreement over every "
        "pixel of the scene, accuracy over its labelled ones; int8 calibrated on a store tiled "
        "from the 2 training scenes."
    )


def real_patch_agreement(work: Path, data: Path, *, epochs: int) -> None:
    """The real labelled patches of `data`: a small_unet trained by `landcover train` on a
    store of the first 6 (sorted by name), each backend and precision mapping the other 2;
    class agreement with torch fp32 and accuracy against their labels. int8 is calibrated on
    the model's training store (predict's default for a model that records it)."""
    import landcover

    images = sorted(data.glob("*_naip.tif"))
    if len(images) < 3:
        raise SystemExit(f"--data {data}: expected the *_naip.tif / *_lc.tif patch pairs")
    pairs = [(i, i.with_name(i.name.replace("_naip.tif", "_lc.tif"))) for i in images]
    train, held = pairs[:6], pairs[6:]
    store = work / "real-chips.zarr"
    landcover.tile(
        [i for i, _ in train], store, labels=[lab for _, lab in train], chip_size=64,
        val_fraction=0.0, class_map="chesapeake7to5", overwrite=True,
    )  # fmt: skip
    run = landcover.train(
        store, work / "real-run", epochs=epochs, batch_size=16, seed=0, device="cpu",
        overwrite=True,
    )  # fmt: skip
    model = run.run_dir / "model.pt"
    maps: dict[tuple[str, str], list[npt.NDArray[np.uint8]]] = {}
    for backend, precision in _runs():
        for k, (image, _) in enumerate(held):
            out = work / f"real-{backend}-{precision}-{k}.tif"
            predict_region(
                PredictConfig(
                    str(model), (str(image),), str(out), device="cpu", backend=backend,
                    precision=precision, progress=False, overwrite=True, window="chip",
                )
            )  # fmt: skip
            maps.setdefault((backend, precision), []).append(_read(out)[0])
    truth = np.concatenate([CLASS_MAP.apply(_read(lab)[0], nodata=15).ravel() for _, lab in held])
    base = np.concatenate([m.ravel() for m in maps["torch", "fp32"]])
    labelled = (truth > 0) & (base > 0)
    print(
        f"## Agreement on the real patches: small_unet trained by `landcover train` ({epochs} "
        f"epochs, 64 px chips) on {len(train)} patches of {data.name}, tested on "
        f"{len(held)} ({base.size:,} px, {int(labelled.sum()):,} labelled)"
    )
    print()
    print("| backend | precision | classes = torch fp32 | accuracy | accuracy − torch fp32 |")
    print("|---|---|---:|---:|---:|")
    base_accuracy = _share(base == truth, labelled)
    for (run_backend, run_precision), parts in maps.items():
        classes = np.concatenate([m.ravel() for m in parts])
        accuracy = _share(classes == truth, labelled)
        print(
            f"| {run_backend} | {run_precision} | {float((classes == base).mean()):.5f} "
            f"| {accuracy:.4f} | {accuracy - base_accuracy:+.4f} |"
        )
    print()
    print(
        "Every row runs the chip's windows (`--window chip`). Agreement over every pixel of "
        "the held-out patches, accuracy over their labelled ones "
        "(Chesapeake classes through chesapeake7to5). int8: calibrated on the training store "
        "the model file records (predict's default without --calibration)."
    )


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
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{cpu_model_name()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {gpu}, load average {load_average():.1f} at start"
    )


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_predict.py"):
        main()
