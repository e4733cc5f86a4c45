"""Training throughput: per-worker speed vs the machine limit, the data path, the in-RAM shard
loader vs random windowed reads, and 1 vs 2 worker processes.

1. Per model (`small_unet`, `unet_resnet18`) on 256 x 256 chips, one training step (forward,
   backward, AdamW) with every thread: step time, pixels/s per worker, model FLOPs per step
   (counted with torch.utils.flop_counter.FlopCounterMode), achieved GFLOP/s divided by the
   machine's measured fp32 matmul peak (a large matmul on every thread) = model-FLOPs
   utilisation (MFU). On CUDA: bf16 autocast + channels_last, peak = measured bf16 matmul.
2. Data path: the time `landcover.data.shards` takes to produce a batch (index into the in-RAM uint8
   shard, random flip/rot90, normalise) as a fraction of the step. Goal: < 2 %.
3. Loader: samples/s of the in-RAM shard (after its one-time load, reported too) vs reading
   random 256 px windows from the GeoTIFFs every step, as TorchGeo does (RasterDataset +
   RandomGeoSampler, num_workers=0) when `--torchgeo-python` names an interpreter that has
   torchgeo (a scratch venv: it is not a project dependency), and always with plain rasterio
   windowed reads of a random window per sample (what TorchGeo does underneath, without its
   index and mosaicking). Goal: in-RAM >= 20x.
4. Scaling: `landcover train --nproc N --threads 1` for N = 1, 2 on a synthetic store, same
   global batch work per epoch: epoch-time speed-up and efficiency (speed-up / 2), plus the
   data-time fraction the trainer itself measured. Goal: efficiency >= 90 %. On a machine
   shared with other work the 2-worker number suffers first: check `uptime` next to it.

Usage: python benchmarks/bench_train.py [--quick] [--device auto|cpu|cuda]
                                        [--torchgeo-python /path/to/venv/bin/python]
Prints tables with ratios; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.windows
import torch
from torch.utils.flop_counter import FlopCounterMode

from landcover.data import ShardDataset, gather_chips, normalise, random_ops
from landcover.models.registry import build_model
from landcover.training import cpu_model_name, segmentation_loss
from tiling.chipstore.store import load_shard_into_memory, open_store
from tiling.runtime.machine import local_cpu_count
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

CHIP = 256
NUM_CLASSES = 5
MODELS = ("small_unet", "unet_resnet18")

TORCHGEO_SCRIPT = """
import json, sys, time, torch, torchgeo
from torch.utils.data import DataLoader
from torchgeo.datasets import RasterDataset, stack_samples
from torchgeo.samplers import RandomGeoSampler
naip, labels, chip, n, batch, threads = sys.argv[1:7]
torch.set_num_threads(int(threads))
class Images(RasterDataset):
    filename_glob = "*.tif"
    is_image = True
class Labels(RasterDataset):
    filename_glob = "*_lc.tif"
    is_image = False
dataset = Images(paths=naip) & Labels(paths=labels)
sampler = RandomGeoSampler(dataset, size=int(chip), length=int(n))
loader = DataLoader(dataset, batch_size=int(batch), sampler=sampler, collate_fn=stack_samples)
batches = iter(loader)
next(batches)  # opens the files and builds the index, like our one-time load
start, count = time.perf_counter(), 0
for b in batches:
    count += b["image"].shape[0]
print(json.dumps({"samples_per_s": count / (time.perf_counter() - start),
                  "version": torchgeo.__version__}))
"""


@dataclass(frozen=True)
class StepResult:
    model: str
    params_m: float
    gflop_per_step: float
    step_s: float
    pixels_per_s: float
    data_s: float

    @property
    def achieved_gflops(self) -> float:
        return self.gflop_per_step / self.step_s


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, smaller store")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batch-size", type=int, default=None, help="default 8 (cpu), 32 (cuda)")
    parser.add_argument(
        "--torchgeo-python",
        default=os.environ.get("TORCHGEO_PYTHON"),
        help="an interpreter with torchgeo installed (e.g. a scratch venv) for the baseline",
    )
    args = parser.parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    batch = args.batch_size or (32 if cuda else 8)
    threads = local_cpu_count()
    torch.set_num_threads(threads)
    quick = args.quick
    machine = torch.cuda.get_device_name(device) if cuda else cpu_model_name()
    print(f"# bench_train ({'quick' if quick else 'full'}) — {machine}, {threads} cores, ", end="")
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
    print()

    peak = matmul_peak_gflops(device)
    steps = model_steps(device, batch, timed=2 if quick else 3)
    print_model_table(steps, peak, device, batch, threads)

    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        store, scenes = build_store(work, size_px=1024 if quick else 1792)
        loader_comparison(store, scenes, batch, args.torchgeo_python, quick=quick)
        if cuda:
            print("(scaling: skipped on CUDA; it measures CPU worker processes)")
        else:
            scaling(store, work, batch, epochs=2)


# -- 1 + 2: model steps and the data path -------------------------------------------------------


def matmul_peak_gflops(device: torch.device) -> float:
    """Best of a few large matmuls on every thread: fp32 on CPU, bf16 on CUDA."""
    n = 4096 if device.type == "cuda" else 2048
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(6 if device.type == "cuda" else 4):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def model_steps(device: torch.device, batch: int, *, timed: int) -> list[StepResult]:
    results = []
    shard = random_shard(64, seed=0)
    dataset = ShardDataset(
        shard[0], shard[1], band_mean=[100.0] * 4, band_std=[50.0] * 4, device=device
    )
    for name in MODELS:
        torch.manual_seed(0)
        model = build_model(name, num_classes=NUM_CLASSES).to(device)
        if device.type == "cuda":
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batches = dataset.epoch_batches(
            batch_size=batch, steps=len(dataset) // batch, seed=0, epoch=1, rank=0
        )
        example = next(iter(batches))

        def step(images: torch.Tensor, labels: torch.Tensor) -> None:
            train_step(model, optimizer, images, labels, device)  # noqa: B023 - called in-loop

        images, labels = _prepare(example.images, device), example.labels
        with FlopCounterMode(display=False) as counter:
            step(images, labels)
        flops = counter.get_total_flops()
        step(images, labels)  # warm-up (allocator, oneDNN primitives)
        _sync(device)
        start = time.perf_counter()
        for _ in range(timed):
            step(images, labels)
        _sync(device)
        step_s = (time.perf_counter() - start) / timed
        data_s = time_batches(dataset, batch)
        results.append(
            StepResult(
                model=name,
                params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                gflop_per_step=flops / 1e9,
                step_s=step_s,
                pixels_per_s=batch * CHIP * CHIP / step_s,
                data_s=data_s,
            )
        )
    return results


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
) -> None:
    """What the trainer does per step, minus DDP: forward, loss, backward, AdamW."""
    with _autocast(device):
        logits = model(images)
    loss = segmentation_loss(logits.float(), labels, class_weights=None, dice=False)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def time_batches(dataset: ShardDataset, batch: int) -> float:
    """Seconds per batch of the trainer's own data path (shuffle, flip/rot90, normalise)."""
    steps = len(dataset) // batch
    best = float("inf")
    for epoch in range(1, 4):
        batches = dataset.epoch_batches(batch_size=batch, steps=steps, seed=0, epoch=epoch, rank=0)
        for _ in batches:
            pass
        _sync(dataset.device)
        best = min(best, batches.data_time_s / steps)
    return best


def print_model_table(
    steps: list[StepResult], peak: float, device: torch.device, batch: int, threads: int
) -> None:
    what = "bf16 autocast, channels_last" if device.type == "cuda" else f"fp32, {threads} threads"
    print(
        f"## 1-2. One worker's training step and its data path: {CHIP} px chips, batch {batch}, "
        f"{what}"
    )
    print()
    print(f"machine peak (measured matmul): {peak:,.0f} GFLOP/s")
    print()
    print(
        "| model | params (M) | GFLOP/step | step (s) | pixels/s per worker | achieved GFLOP/s "
        "| MFU (vs matmul peak) | data (ms/batch) | data / step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in steps:
        print(
            f"| {r.model} | {r.params_m:.2f} | {r.gflop_per_step:.1f} | {r.step_s:.3f} "
            f"| {r.pixels_per_s:,.0f} | {r.achieved_gflops:.1f} | {r.achieved_gflops / peak:.1%} "
            f"| {r.data_s * 1e3:.2f} | {r.data_s / r.step_s:.2%} |"
        )
    print()
    worst = max(r.data_s / r.step_s for r in steps)
    print(
        f"goal: data < 2 % of the step — worst {worst:.2%} ({'met' if worst < 0.02 else 'MISSED'})"
    )
    print()


# -- 3: loaders ---------------------------------------------------------------------------------


def build_store(work: Path, *, size_px: int) -> tuple[str, Any]:
    scenes = synthesize_scenes(SynthConfig(out_dir=work / "scenes", scenes=2, size_px=size_px))
    url = str(work / "chips.zarr")
    tile(
        TileConfig(
            images=tuple(str(p) for p in scenes.image_paths),
            labels=tuple(str(p) for p in scenes.label_paths),
            out=url,
            chip_size=CHIP,
            shard_size=16,
            val_fraction=0.2,
            split_block_chips=2,  # small scenes still get val blocks
        )
    )
    return url, scenes


def loader_comparison(
    store: str, scenes: Any, batch: int, torchgeo_python: str | None, *, quick: bool
) -> None:
    """Every loader on one core (one torch thread, one process): a worker's share of the
    machine when workers = cores, and immune to OMP threads waiting on a busy core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _loader_comparison(store, scenes, batch, torchgeo_python, quick=quick)
    finally:
        torch.set_num_threads(threads)


def _loader_comparison(
    store: str, scenes: Any, batch: int, torchgeo_python: str | None, *, quick: bool
) -> None:
    summary = open_store(store).summary
    shard = load_shard_into_memory(store, rank=0, world_size=1, split="train")
    assert shard.labels is not None
    dataset = ShardDataset(
        shard.images, shard.labels, band_mean=summary.band_mean, band_std=summary.band_std
    )
    samples = 48 if quick else 160
    fetch = {
        "ours": batch / time_fetches(dataset, batch),
        "rasterio": rasterio_random_windows(scenes, samples, dataset=None),
    }
    ready = {
        "ours": batch / time_batches(dataset, batch),
        "rasterio": rasterio_random_windows(scenes, samples, dataset=dataset),
    }
    torchgeo = run_torchgeo(torchgeo_python, scenes, samples, batch, threads=1)
    print(
        f"## 3. Loader: samples/s of {CHIP} px chips (image + labels), batch {batch}, one core "
        "each (1 torch thread, no loader processes)"
    )
    print()
    print("| loader | delivers | samples/s | in-RAM is ... faster |")
    print("|---|---|---:|---:|")
    rows = [
        ("in-RAM shard (ours): index the uint8 shard", "uint8 chips", fetch["ours"], None),
        ("rasterio: read a random window per sample", "uint8 chips", fetch["rasterio"], "ours"),
    ]
    if torchgeo is not None:
        name = f"TorchGeo {torchgeo[1]}: RasterDataset + RandomGeoSampler"
        rows.append((name, "float32 image, int64 mask", torchgeo[0], "ours"))
    rows += [
        ("in-RAM shard (ours): the trainer's batches", "model-ready", ready["ours"], None),
        (
            "rasterio window + the same flip/rot90 + normalise",
            "model-ready",
            ready["rasterio"],
            "r",
        ),
    ]
    for name, delivers, rate, against in rows:
        ratio = (
            ""
            if against is None
            else f"{(ready if against == 'r' else fetch)['ours'] / rate:,.0f}x"
        )
        print(f"| {name} | {delivers} | {rate:,.0f} | {ratio} |")
    load_rate = len(dataset) / shard.load_time_s
    print(
        f"| one-time load of the shard ({len(dataset)} chips, {shard.bytes_read / 2**20:.1f} MiB "
        f"stored, {shard.load_time_s:.2f} s) | uint8 chips | {load_rate:,.0f} | once per run |"
    )
    print()
    if torchgeo is None:
        print("(TorchGeo: not measured; pass --torchgeo-python with a venv that has torchgeo)")
    baselines = [fetch["rasterio"]] + ([torchgeo[0]] if torchgeo is not None else [])
    worst = fetch["ours"] / max(baselines)
    which = "rasterio and TorchGeo" if torchgeo is not None else "rasterio"
    print(
        f"goal: in-RAM >= 20x per-step windowed reads ({which}), chips delivered as the loaders "
        f"deliver them — worst {worst:,.0f}x ({'met' if worst >= 20 else 'MISSED'}); "
        f"model-ready batches, where both sides also pay for the same augmentation and "
        f"float conversion: {ready['ours'] / ready['rasterio']:,.0f}x"
    )
    print()


def time_fetches(dataset: ShardDataset, batch: int) -> float:
    """Seconds per batch to gather shuffled chips from the in-RAM uint8 shard."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    batches = [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for indices in batches:
            dataset.images.index_select(0, indices), dataset.labels.index_select(0, indices)
        best = min(best, (time.perf_counter() - start) / len(batches))
    return best


def rasterio_random_windows(scenes: Any, samples: int, *, dataset: ShardDataset | None) -> float:
    """Samples/s reading a random CHIP window of a random scene (4 bands + labels) each time;
    with `dataset`, also augmented and normalised by the trainer's own functions."""
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    pairs = [
        (rasterio.open(i), rasterio.open(lbl))
        for i, lbl in zip(scenes.image_paths, scenes.label_paths, strict=True)
    ]

    def sample() -> None:
        pixels, mask = read_random_window(pairs, rng)
        if dataset is not None:
            images, _ = gather_chips(
                torch.from_numpy(pixels)[None],
                torch.from_numpy(mask)[None],
                torch.zeros(1, dtype=torch.int64),
                random_ops(1, generator),
            )
            normalise(images, dataset.mean, dataset.std)

    try:
        sample()  # fills GDAL's block cache, like the first batch of any loader
        start = time.perf_counter()
        for _ in range(samples):
            sample()
        return samples / (time.perf_counter() - start)
    finally:
        for image, labels in pairs:
            image.close()
            labels.close()


def read_random_window(
    pairs: list[Any], rng: np.random.Generator
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    image, labels = pairs[int(rng.integers(len(pairs)))]
    row = int(rng.integers(0, image.height - CHIP))
    col = int(rng.integers(0, image.width - CHIP))
    window = rasterio.windows.Window(col, row, CHIP, CHIP)
    pixels = image.read(window=window)
    bounds = rasterio.windows.bounds(window, image.transform)
    label_window = rasterio.windows.from_bounds(*bounds, transform=labels.transform)
    label_window = label_window.round_offsets().round_lengths()
    mask = labels.read(1, window=label_window, boundless=True, out_shape=(CHIP, CHIP))
    return pixels, mask


def run_torchgeo(
    python: str | None, scenes: Any, samples: int, batch: int, *, threads: int
) -> tuple[float, str] | None:
    if not python:
        return None
    naip_dir = str(Path(scenes.image_paths[0]).parent)
    label_dir = str(Path(scenes.label_paths[0]).parent)
    args = [naip_dir, label_dir, str(CHIP), str(samples + batch), str(batch), str(threads)]
    done = subprocess.run(
        [python, "-c", TORCHGEO_SCRIPT, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        print(f"(TorchGeo baseline failed: {done.stderr.strip().splitlines()[-1:]})")
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["samples_per_s"]), str(result["version"])


# -- 4: scaling ---------------------------------------------------------------------------------


def scaling(store: str, work: Path, batch: int, *, epochs: int) -> None:
    rows = []
    for nproc in (1, 2):
        run = work / f"run-{nproc}"
        command = [
            sys.executable, "-m", "landcover.cli.app", "-q", "train", store, "--out", str(run),
            "--nproc", str(nproc), "--threads", "1", "--epochs", str(epochs),
            "--batch-size", str(batch), "--device", "cpu", "--overwrite",
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        best = lines[-1]  # the first epoch pays for warm-up
        rows.append((nproc, best, os.getloadavg()[0]))
    one = rows[0][1]
    print(
        f"## 4. Scaling: `landcover train --nproc N --threads 1`, small_unet, batch {batch} "
        f"per worker, last of {epochs} epochs (the first pays for warm-up)"
    )
    print()
    print(
        "| workers | steps/epoch per worker | epoch (s) | samples/s (all) | speed-up | efficiency "
        "| CPU s/sample | CPU efficiency | data / step | comm ms/step | load avg |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nproc, m, load in rows:
        speedup = m["samples_per_s"] / one["samples_per_s"]
        cpu_eff = _cpu_per_sample(one) / _cpu_per_sample(m)
        print(
            f"| {nproc} | {m['steps']} | {m['epoch_time_s']:.2f} | {m['samples_per_s']:.2f} "
            f"| {speedup:.2f}x | {speedup / nproc:.0%} | {_cpu_per_sample(m):.3f} "
            f"| {cpu_eff:.0%} | {m['data_time_s'] / m['step_time_s']:.2%} "
            f"| {m['comm_time_s'] * 1e3:.1f} | {load:.1f} |"
        )
    print()
    efficiency = rows[1][1]["samples_per_s"] / one["samples_per_s"] / 2
    print(
        f"goal: 2-worker efficiency >= 90 % — {efficiency:.0%} "
        f"({'met' if efficiency >= 0.9 else 'MISSED'}); speed-up from samples/s (the same global "
        "work per epoch). CPU efficiency = CPU-seconds per sample with 1 worker / with 2: what "
        "the efficiency would be on idle cores, nearly immune to other load on the machine"
    )
    print()


def _cpu_per_sample(m: dict[str, Any]) -> float:
    return float(m["epoch_cpu_s"]) / float(m["steps"] * m["batch_size"] * m["world_size"])


# -- helpers ------------------------------------------------------------------------------------


def random_shard(n: int, *, seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 4, CHIP, CHIP), dtype=np.uint8)
    labels = rng.integers(0, NUM_CLASSES, (n, CHIP, CHIP), dtype=np.uint8)
    return images, labels


def _prepare(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    images = images.to(device)
    if device.type == "cuda":
        images = images.contiguous(memory_format=torch.channels_last)
    return images


def _autocast(device: torch.device) -> AbstractContextManager[Any]:
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return nullcontext()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_train.py"):
        main()
