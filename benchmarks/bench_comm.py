"""Communication modes side by side: bytes, comm time, epoch time and val mIoU at 2 workers.

For `small_unet` and `unet_resnet18`, every mode of `landcover train --compression` (none,
fp16, bf16, powersgd:2, onebit) and `--block-momentum` (BMUF, blocks of 4 steps) trains the
same synthetic store with `landcover train --nproc 2 --threads 1` (torchrun, gloo, one core
per worker), same seed and settings, one run after another. From each run's metrics.jsonl:

- bytes/step: the payload each rank hands to collectives per step (`comm_bytes_per_step`),
  mean over epochs 2..E (PowerSGD's first epoch starts with 2 fp32 steps); BMUF's one model
  average per block is spread over the block's steps;
- comm ms/step: time with a bucket's communication in flight (compression and decompression
  included), overlapping the backward pass (`comm_time_s`);
- epoch s: the training steps of an epoch, median over epochs 2..E (the first pays for DDP's
  bucket rebuild and the allocator's warm-up);
- CPU s/epoch: CPU seconds of those steps summed over both workers (`epoch_cpu_s`), median as
  above: unlike wall time, barely moved by other jobs on a shared machine;
- val mIoU: of the last epoch, and the best over the run (12 epochs on a small store, one
  seed: an indication of quality);
- run s: the whole launch, torch's import, load, validation and checkpoints included.

Ratios are this mode / `none` (below 1 is less). SGD with Nesterov momentum for every mode,
as in the parity test (`--optimizer adamw` to compare with the trainer's default).

Quality parity over seeds (`--seeds N`): every mode trains again at seeds 0..N-1, and a second
table prints each mode's best val mIoU (mean, standard deviation) and its paired difference from
`none` at the same seed (mean, min, max). One seed's difference is noise of about ±0.06 for
BMUF on a store this small, so parity is read from the mean over seeds, never from one run;
tests/landcover/comm/test_parity.py checks only that every mode learns.

Usage: python benchmarks/bench_comm.py [--quick] [--epochs N] [--optimizer sgd|adamw]
                                       [--models small_unet,unet_resnet18] [--modes bmuf,...]
                                       [--seeds N]
Prints the machine, the load average before and after, and one table per model; never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from landcover.models.registry import build_model
from landcover.training.distributed import cpu_model_name
from tiling.runtime.machine import local_cpu_count
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

CHIP_PX = 64
BATCH = 8
BLOCK_SIZE = 4
MODELS = ("small_unet", "unet_resnet18")
MODES: dict[str, list[str]] = {
    "none": [],
    "fp16": ["--compression", "fp16"],
    "bf16": ["--compression", "bf16"],
    "powersgd:2": ["--compression", "powersgd:2"],
    "onebit": ["--compression", "onebit"],
    "bmuf": ["--block-momentum", "--bmuf-block-steps", str(BLOCK_SIZE)],
}


@dataclass(frozen=True)
class RunResult:
    model: str
    mode: str
    wall_s: float  # the whole launch: torchrun, imports, load, training, validation
    load_after: float
    lines: list[dict[str, Any]]
    error: str | None = None

    def steady(self) -> list[dict[str, Any]]:
        return self.lines[1:] or self.lines

    def median(self, key: str) -> float:
        return float(statistics.median(float(m[key]) for m in self.steady()))

    @property
    def bytes_per_step(self) -> float:
        return float(statistics.fmean(float(m["comm_bytes_per_step"]) for m in self.steady()))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 scenes, 2 epochs")
    parser.add_argument("--epochs", type=int, default=None, help="default 12 (quick: 2)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument(
        "--seeds", type=int, default=1, help="train every mode at seeds 0..N-1 (parity table)"
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)}; none always runs (the ratios' base)",
    )
    args = parser.parse_args()
    modes = ["none"] + [m.strip() for m in args.modes.split(",") if m.strip() not in ("", "none")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes {','.join(unknown)}: unknown; choose from {', '.join(MODES)}")
    epochs = args.epochs or (2 if args.quick else 12)
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    scenes = 2 if args.quick else 4
    started = time.perf_counter()
    print(
        f"# bench_comm ({'quick' if args.quick else 'full'}) — {cpu_model_name()}, "
        f"{local_cpu_count()} cores, torch {torch.__version__}; 2 workers x 1 thread (gloo)"
    )
    print(f"load average before: {_load()}")
    print()
    with tempfile.TemporaryDirectory(prefix="bench_comm_") as tmp:
        work = Path(tmp)
        store, train_chips, val_chips = build_store(work, scenes=scenes)
        print(
            f"store: {scenes} synthetic scenes of 448 px, {CHIP_PX} px chips, {train_chips} "
            f"train / {val_chips} val; batch {BATCH} per worker, {epochs} epochs, "
            f"--optimizer {args.optimizer}, seed 0"
            + (f" (and seeds 1..{args.seeds - 1} for the parity table)" if args.seeds > 1 else "")
        )
        print()
        for model in models:
            by_seed = [
                [
                    run_mode(
                        store, work, model, mode, epochs=epochs, optimizer=args.optimizer, seed=seed
                    )
                    for mode in modes
                ]
                for seed in range(args.seeds)
            ]
            print_table(model, by_seed[0], epochs=epochs)
            if args.seeds > 1:
                print_parity(model, by_seed)
    print(f"load average after: {_load()}; total {time.perf_counter() - started:.0f} s")


def build_store(work: Path, *, scenes: int) -> tuple[str, int, int]:
    synth = synthesize_scenes(
        SynthConfig(out_dir=work / "scenes", scenes=scenes, size_px=448, seed=0)
    )
    url = str(work / "chips.zarr")
    tile(
        TileConfig(
            images=tuple(str(p) for p in synth.image_paths),
            labels=tuple(str(p) for p in synth.label_paths),
            out=url,
            chip_size=CHIP_PX,
            shard_size=16,
            val_fraction=0.25,
            workers=1,
        )
    )
    from tiling.chipstore.store import open_store

    summary = open_store(url).summary
    return url, int(summary.num_train), int(summary.num_val)


def run_mode(
    store: str, work: Path, model: str, mode: str, *, epochs: int, optimizer: str, seed: int
) -> RunResult:
    run = work / f"{model}-{mode.replace(':', '-')}-seed{seed}"
    command = [
        sys.executable, "-m", "landcover.cli.app", "-q", "train", store, "--out", str(run),
        "--nproc", "2", "--threads", "1", "--device", "cpu", "--model", model,
        "--epochs", str(epochs), "--batch-size", str(BATCH), "--optimizer", optimizer,
        "--seed", str(seed), *MODES[mode],
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    metrics = run / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    error = None
    if done.returncode != 0 or len(lines) != epochs:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        error = f"exit {done.returncode}: " + " | ".join(tail)
    status = "" if error is None else " FAILED"
    print(f"  {model} {mode} seed {seed}: {wall_s:.0f} s{status}", file=sys.stderr)
    return RunResult(model, mode, wall_s, load_after, lines, error)


def print_table(model: str, results: list[RunResult], *, epochs: int) -> None:
    params = sum(p.numel() for p in build_model(model, num_classes=5).parameters())
    print(
        f"## {model}: {params / 1e6:.2f} M parameters, {4 * params / 2**20:.1f} MiB of fp32 "
        f"gradients per step; bytes: mean, comm/epoch/CPU: median of epochs 2..{epochs}; "
        "ratio = mode / none"
    )
    print()
    print(
        "| mode | bytes/step | bytes ratio | comm ms/step | comm ratio | epoch s | epoch ratio "
        "| CPU s/epoch | CPU ratio | val mIoU last (best) | run s | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = next((r for r in results if r.mode == "none" and r.error is None), None)
    for r in results:
        if r.error is not None:
            print(f"| {r.mode} | failed: {r.error} |||||||||||")
            continue
        comm_ms = r.median("comm_time_s") * 1e3
        epoch_s, cpu_s = r.median("epoch_time_s"), r.median("epoch_cpu_s")
        last, best = r.lines[-1]["val_miou"], max(m["val_miou"] for m in r.lines)

        def ratio(value: float, key: str, r: RunResult = r) -> str:
            if base is None:
                return "—"
            reference = base.bytes_per_step if key == "bytes" else base.median(key)
            return f"{value / reference:.3f}" if reference > 0 else "—"

        print(
            f"| {r.mode} | {_bytes(r.bytes_per_step)} | {ratio(r.bytes_per_step, 'bytes')} "
            f"| {comm_ms:.1f} | {ratio(comm_ms / 1e3, 'comm_time_s')} "
            f"| {epoch_s:.2f} | {ratio(epoch_s, 'epoch_time_s')} "
            f"| {cpu_s:.2f} | {ratio(cpu_s, 'epoch_cpu_s')} "
            f"| {last:.3f} ({best:.3f}) | {r.wall_s:.0f} | {r.load_after:.1f} |"
        )
    print()


def print_parity(model: str, by_seed: list[list[RunResult]]) -> None:
    """Best val mIoU per mode over the seeds, and its paired difference from none's."""
    print(f"## {model}: best val mIoU over {len(by_seed)} seeds; diff = mode - none, same seed")
    print()
    print("| mode | best mIoU mean | std | diff mean | diff min | diff max | seeds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, mode in enumerate(r.mode for r in by_seed[0]):
        bests, diffs = [], []
        for runs in by_seed:
            base, run = runs[0], runs[i]
            if run.error is None and run.lines:
                best = max(float(m["val_miou"]) for m in run.lines)
                bests.append(best)
                if base.error is None and base.lines:
                    diffs.append(best - max(float(m["val_miou"]) for m in base.lines))
        if not bests:
            print(f"| {mode} | failed at every seed ||||||")
            continue
        std = statistics.stdev(bests) if len(bests) > 1 else float("nan")
        print(
            f"| {mode} | {statistics.fmean(bests):.3f} | {std:.3f} "
            f"| {statistics.fmean(diffs):+.3f} | {min(diffs):+.3f} | {max(diffs):+.3f} "
            f"| {len(bests)} |"
        )
    print()


def _bytes(count: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg()) + " (1, 5, 15 min)"


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_comm.py"):
        main()
