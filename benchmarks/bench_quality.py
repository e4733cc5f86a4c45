"""Map quality on real labels: k-fold cross-validation over labelled patches, per candidate
recipe (model + training options + chip size).

The data directory holds pairs `*_naip.tif` (4-band imagery) and `*_lc.tif` (labels, e.g.
the Chesapeake patches of `../shared/data/chesapeake-wv`). The patches are the unit of a fold:
each fold holds out whole patches, so no pixel of a held-out patch, nor its neighbourhood,
reaches training. Per fold and candidate the benchmark runs the product's own path end to end:

1. `landcover tile` of the fold's training patches (`--val-fraction 0`: every training chip
   trains, and `model.pt` is the last epoch's model);
2. `landcover train --nproc N` (default 2 CPU workers, one thread each) with the candidate's
   options;
3. `landcover predict` of every held-out patch, and `landcover evaluate`'s scoring
   (`landcover.evaluation`) of the map against the patch's labels.

The confusion matrices of all held-out patches of all folds are summed: pixel accuracy, mIoU
over the classes present, per-class IoU, and the mIoU over tree canopy and low vegetation (the
two classes every patch has) come from that sum. The per-fold spread of pixel accuracy is
printed next to it. Training time is the workers' CPU seconds (`epoch_cpu_s` of metrics.jsonl,
summed over ranks and epochs) and the wall time of the training command: on a machine shared
with other work the wall time is inflated and the CPU time is the figure to compare.

All patches come from one NAIP tile, so every held-out patch shares the training patches'
radiometry, which another tile (another flight) does not. Each held-out patch is therefore
also predicted 15 % darker and 15 % brighter (`SHIFT_GAINS`), and scored the same way: a model
that learnt one tile's brightness instead of the land cover falls apart there.

Results go to `benchmarks/results/quality.json` (`--json`, the format of
`benchmarks/resultfile.py`), from which `docs/benchmarks/quality.md`'s table is generated.

Usage:
    python benchmarks/bench_quality.py --data ../shared/data/chesapeake-wv [--folds 4]
        [--candidates NAME ...] [--nproc 2] [--work DIR] [--json PATH]
Never asserts on time or scores; prints ratios to the majority class and to the unshifted
accuracy.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import rasterio
from resultfile import (
    Cell,
    ResultFile,
    ResultTable,
    read_result_file,
    table_markdown,
    this_machine,
    today,
    write_result_file,
)

from landcover import api
from landcover.evaluation import EvaluateConfig, evaluate_prediction, scores_from_confusion
from tiling.classes import get_class_map

CLASS_MAP = "chesapeake7to5"
# The two classes every patch of the Chesapeake WV data has; the target mIoU is theirs.
TARGET_CLASSES = (2, 3)  # tree canopy, low vegetation
# Held-out patches are also scored 15 % darker and brighter: a stand-in for another tile, flown
# on another day, which these patches (all of one tile) cannot give.
SHIFT_GAINS = (0.85, 1.15)
LANDCOVER = [sys.executable, "-m", "landcover", "-q"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A recipe: the chip size to tile with and the `landcover train` options."""

    name: str
    chip_size: int
    train_args: tuple[str, ...]
    note: str = ""


def recipe(
    model: str,
    epochs: int,
    *,
    jitter: float,
    class_weights: str = "auto",
    loss: str | None = None,
    lr: float | None = None,
    warmup_epochs: float | None = None,
) -> tuple[str, ...]:
    """`landcover train` options of a candidate: every option the candidates vary, spelled
    out, so that a change of a default does not change a candidate (loss, lr and warm-up
    only where a candidate sets them, so that the earlier candidates keep their rows)."""
    extra: tuple[str, ...] = ()
    if loss is not None:
        extra += ("--loss", loss)
    if lr is not None:
        extra += ("--lr", f"{lr:g}")
    if warmup_epochs is not None:
        extra += ("--warmup-epochs", f"{warmup_epochs:g}")
    return (
        *("--model", model, "--epochs", str(epochs), "--batch-size", "4"),
        *("--brightness-jitter", f"{jitter:g}", "--class-weights", class_weights),
        *extra,
    )


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        Candidate(
            "issue-baseline",
            128,
            recipe("small_unet", 30, jitter=0),
            "the recipe of issue 34 (30 epochs, batch 4, the defaults before it)",
        ),
        Candidate(
            "resnet18-baseline",
            128,
            recipe("unet_resnet18", 30, jitter=0),
            "unet_resnet18 with the same options",
        ),
        Candidate(
            "resnet18-jitter",
            128,
            recipe("unet_resnet18", 30, jitter=0.2),
            "unet_resnet18, random band gains of up to 20 %",
        ),
        Candidate(
            "small-60",
            128,
            recipe("small_unet", 60, jitter=0),
            "small_unet, 60 epochs, no brightness jitter",
        ),
        Candidate(
            "small-jitter-60",
            128,
            recipe("small_unet", 60, jitter=0.2),
            "small_unet, random band gains of up to 20 %, 60 epochs",
        ),
        Candidate(
            "small-jitter-60-unweighted",
            128,
            recipe("small_unet", 60, jitter=0.2, class_weights="none"),
            "as small-jitter-60, without class weights",
        ),
        Candidate(
            "small-jitter-60-dice",
            128,
            recipe("small_unet", 60, jitter=0.2, loss="ce+dice"),
            "as small-jitter-60, cross-entropy + Dice loss",
        ),
        Candidate(
            "small-jitter-60-lr1e-3",
            128,
            recipe("small_unet", 60, jitter=0.2, lr=1e-3),
            "as small-jitter-60, half the default AdamW lr (2e-3)",
        ),
        Candidate(
            "small-jitter-60-lr4e-3",
            128,
            recipe("small_unet", 60, jitter=0.2, lr=4e-3),
            "as small-jitter-60, twice the default AdamW lr",
        ),
        Candidate(
            "small-jitter-60-warmup5",
            128,
            recipe("small_unet", 60, jitter=0.2, warmup_epochs=5),
            "as small-jitter-60, 5 warm-up epochs before the cosine decay (default 1)",
        ),
        Candidate(
            "small-jitter-60-chip64",
            64,
            recipe("small_unet", 60, jitter=0.2),
            "as small-jitter-60, 64 px chips (4x the chips, each a quarter of the pixels)",
        ),
        Candidate(
            "small-jitter-60-chip64-warmup5",
            64,
            recipe("small_unet", 60, jitter=0.2, warmup_epochs=5),
            "as small-jitter-60, 64 px chips and 5 warm-up epochs",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Patch:
    """One labelled patch: imagery and its label raster."""

    name: str
    image: Path
    labels: Path


def find_patches(data_dir: Path) -> list[Patch]:
    """The `*_naip.tif` / `*_lc.tif` pairs of `data_dir`, sorted by name."""
    patches = []
    for image in sorted(data_dir.glob("*_naip.tif")):
        labels = image.with_name(image.name.removesuffix("_naip.tif") + "_lc.tif")
        if not labels.exists():
            raise SystemExit(f"{image}: no label raster {labels.name} beside it")
        patches.append(Patch(image.name.removesuffix("_naip.tif"), image, labels))
    if not patches:
        raise SystemExit(f"{data_dir}: no *_naip.tif patches; pass --data the patch directory")
    return patches


def fold_split(n_items: int, folds: int) -> list[tuple[list[int], list[int]]]:
    """(train, held-out) indices of each of `folds` folds: item i is held out in fold
    i % folds, so every item is held out exactly once and fold sizes differ by at most one."""
    if not 2 <= folds <= n_items:
        raise SystemExit(f"--folds {folds}: must be between 2 and the {n_items} patches")
    split = []
    for fold in range(folds):
        held = [i for i in range(n_items) if i % folds == fold]
        split.append(([i for i in range(n_items) if i % folds != fold], held))
    return split


@dataclass(slots=True)
class Pooled:
    """Confusion counts (truth rows x predicted columns, codes 1..K-1) summed over patches."""

    num_classes: int
    confusion: npt.NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        k = self.num_classes - 1
        self.confusion = np.zeros((k, k), dtype=np.int64)

    def add(self, confusion: npt.NDArray[np.int64]) -> None:
        self.confusion += confusion

    def scores(self) -> dict[str, Any]:
        """Pixel accuracy, mIoU (classes in truth or prediction), per-class IoU, target mIoU
        and the majority-class accuracy of the same pixels (`landcover.evaluation`)."""
        evaluation = scores_from_confusion(
            self.confusion,
            get_class_map(CLASS_MAP),
            prediction="folds",
            truth=(),
            truth_class_map=CLASS_MAP,
        )
        per_class = {c.name: c.iou for c in evaluation.classes}
        target = [
            c.iou if c.iou is not None else 0.0
            for c in evaluation.classes
            if c.code in TARGET_CLASSES
        ]
        truth_pixels = self.confusion.sum(axis=1)
        total = int(truth_pixels.sum())
        return {
            "pixels": total,
            "pixel_accuracy": evaluation.pixel_accuracy,
            "miou": evaluation.mean_iou,
            "target_miou": float(np.mean(target)) if target else math.nan,
            "per_class_iou": per_class,
            "majority_accuracy": float(truth_pixels.max() / total) if total else math.nan,
        }


def scaled_copy(image: Path, gain: float, work: Path) -> Path:
    """`image` with every band multiplied by `gain` (clipped to uint8; 0 stays 0, so nodata
    stays nodata): the same ground under another flight's brightness."""
    out = work / f"{image.stem}-x{gain:g}.tif"
    with rasterio.open(image) as src:
        profile = src.profile
        pixels = src.read().astype(np.float32) * gain
    with rasterio.open(out, "w", **profile) as dst:
        dst.write(np.clip(np.rint(pixels), 0, 255).astype(np.uint8))
    return out


def run(argv: list[str], *, cwd: Path | None = None) -> float:
    """Run a landcover command quietly; its wall seconds. Fails loudly with its stderr."""
    start = time.perf_counter()
    done = subprocess.run([*LANDCOVER, *argv], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"landcover {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def train_cpu_s(run_dir: Path) -> tuple[float, int]:
    """CPU seconds of all workers over all epochs (metrics.jsonl) and the epochs run."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(float(r["epoch_cpu_s"]) for r in records), len(records)


def run_fold(
    candidate: Candidate,
    train: Sequence[Patch],
    held_out: Sequence[Patch],
    *,
    work: Path,
    nproc: int,
    seed: int,
) -> dict[str, Any]:
    """Tile, train and predict one fold; its confusion, CPU and wall seconds."""
    work.mkdir(parents=True, exist_ok=True)
    store, run_dir = work / "chips.zarr", work / "run"
    api.tile(
        [p.image for p in train],
        store,
        labels=[p.labels for p in train],
        chip_size=candidate.chip_size,
        val_fraction=0.0,
        class_map=CLASS_MAP,
        overwrite=True,
    )
    wall_s = run(
        [
            *("train", str(store), "--out", str(run_dir), "--nproc", str(nproc)),
            *("--threads", "1", "--tracking", "none", "--seed", str(seed), "--overwrite"),
            *candidate.train_args,
        ]
    )
    cpu_s, epochs = train_cpu_s(run_dir)
    num_classes = get_class_map(CLASS_MAP).num_classes
    pooled, shifted = Pooled(num_classes), Pooled(num_classes)
    for patch in held_out:
        for gain in (1.0, *SHIFT_GAINS):
            image = patch.image if gain == 1.0 else scaled_copy(patch.image, gain, work)
            out = work / f"{image.stem}-map.tif"
            # in this process: one torch import for every patch
            api.predict(run_dir / "model.pt", image, out, overwrite=True)
            confusion = evaluate_prediction(EvaluateConfig(str(out), (str(patch.labels),)))
            (pooled if gain == 1.0 else shifted).add(confusion.confusion)
    return {
        "confusion": pooled.confusion,
        "shifted_confusion": shifted.confusion,
        "train_cpu_s": cpu_s,
        "train_wall_s": wall_s,
        "epochs": epochs,
    }


def evaluate_candidate(
    candidate: Candidate,
    patches: Sequence[Patch],
    *,
    folds: int,
    work: Path,
    nproc: int,
    seed: int,
) -> dict[str, Any]:
    """Every fold of one candidate; pooled scores, per-fold accuracy, mean times per fold."""
    num_classes = get_class_map(CLASS_MAP).num_classes
    pooled, shifted = Pooled(num_classes), Pooled(num_classes)
    fold_accuracy: list[float] = []
    cpu_s = wall_s = 0.0
    for fold, (train_ids, held_ids) in enumerate(fold_split(len(patches), folds)):
        result = run_fold(
            candidate,
            [patches[i] for i in train_ids],
            [patches[i] for i in held_ids],
            work=work / candidate.name / f"fold{fold}",
            nproc=nproc,
            seed=seed,
        )
        pooled.add(result["confusion"])
        shifted.add(result["shifted_confusion"])
        one = Pooled(num_classes)
        one.add(result["confusion"])
        fold_accuracy.append(float(one.scores()["pixel_accuracy"]))
        cpu_s += result["train_cpu_s"]
        wall_s += result["train_wall_s"]
        print(
            f"  {candidate.name} fold {fold}: accuracy {fold_accuracy[-1]:.3f}, "
            f"train {result['train_cpu_s']:.0f} CPU s / {result['train_wall_s']:.0f} s wall",
            flush=True,
        )
    return {
        "name": candidate.name,
        "chip_size": candidate.chip_size,
        "train_args": list(candidate.train_args),
        "note": candidate.note,
        **pooled.scores(),
        "shifted": shifted.scores(),
        "fold_accuracy": fold_accuracy,
        "train_cpu_s_per_fold": cpu_s / folds,
        "train_wall_s_per_fold": wall_s / folds,
        "confusion": pooled.confusion.tolist(),
        "shifted_confusion": shifted.confusion.tolist(),
    }


def quality_table(candidates: Sequence[dict[str, Any]]) -> ResultTable:
    """One row per candidate: pooled held-out scores, the same under a brightness shift, and
    the training time per fold."""
    rows: list[list[Cell]] = []
    for r in candidates:
        iou = r["per_class_iou"]
        rows.append(
            [
                r["name"],
                r["chip_size"],
                " ".join(r["train_args"]),
                round(r["pixel_accuracy"], 3),
                f"{min(r['fold_accuracy']):.3f}-{max(r['fold_accuracy']):.3f}",
                round(r["target_miou"], 3),
                round(iou["tree canopy"], 3),
                round(iou["low vegetation"], 3),
                round(r["shifted"]["pixel_accuracy"], 3),
                round(r["shifted"]["target_miou"], 3),
                round(r["train_cpu_s_per_fold"]),
                round(r["train_wall_s_per_fold"]),
            ]
        )
    return ResultTable(
        name="quality",
        title="Held-out patches, pooled over the folds",
        columns=[
            "candidate",
            "chip px",
            "training options",
            "pixel accuracy",
            "accuracy per fold",
            "mIoU tree + low veg.",
            "IoU tree canopy",
            "IoU low vegetation",
            "accuracy at ±15 % brightness",
            "mIoU at ±15 % brightness",
            "training CPU s / fold",
            "training wall s / fold",
        ],
        rows=rows,
        note=(
            "mIoU over tree canopy and low vegetation, the two classes of every patch; "
            "majority class (tree canopy) accuracy on the same pixels: "
            f"{candidates[0]['majority_accuracy']:.3f}. CPU s: all workers' process time "
            "(metrics.jsonl epoch_cpu_s); wall s is inflated on a shared machine."
            if candidates
            else ""
        ),
    )


def merge_result_files(paths: Sequence[Path], out: Path) -> None:
    """One result file with the candidates of several runs (e.g. one run per candidate, run
    side by side): their rows in order, their commands and conditions joined."""
    runs = [read_result_file(p) for p in paths]
    candidates = [c for r in runs for c in cast(list[dict[str, Any]], r.extra["candidates"])]
    write_result_file(
        out,
        ResultFile(
            benchmark="bench_quality",
            command="; ".join(r.command for r in runs),
            machine=runs[0].machine,
            date=max(r.date for r in runs),
            tables=[quality_table(candidates)],
            conditions=" | ".join(dict.fromkeys(r.conditions for r in runs)),
            extra={"patches": runs[0].extra["patches"], "candidates": candidates},
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="*_naip.tif / *_lc.tif pairs")
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), metavar="NAME")
    parser.add_argument("--nproc", type=int, default=2, help="training workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "quality.json"
    )
    parser.add_argument(
        "--merge", type=Path, nargs="+", metavar="JSON", help="merge these result files into --json"
    )
    args = parser.parse_args()
    if args.merge:
        merge_result_files(args.merge, args.json)
        print(f"wrote {args.json}")
        return
    if args.data is None:
        parser.error("--data DIR is required (e.g. ../shared/data/chesapeake-wv)")
    unknown = [n for n in args.candidates if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidate {unknown[0]!r}; choose from {', '.join(CANDIDATES)}")
    patches = find_patches(args.data)
    fold_split(len(patches), args.folds)  # a bad --folds fails before any training
    load = os.getloadavg()[0]
    print(
        f"{len(patches)} patches, {args.folds} folds, {args.nproc} CPU workers; "
        f"load average {load:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as scratch:
        work = args.work or Path(scratch)
        results = [
            evaluate_candidate(
                CANDIDATES[name],
                patches,
                folds=args.folds,
                work=work,
                nproc=args.nproc,
                seed=args.seed,
            )
            for name in args.candidates
        ]
    table = quality_table(results)
    print()
    print(table_markdown(table))
    for r in results:
        print(
            f"{r['name']}: accuracy {r['pixel_accuracy']:.3f} = "
            f"{r['pixel_accuracy'] / r['majority_accuracy']:.3f}x the majority class; "
            f"at ±15 % brightness {r['shifted']['pixel_accuracy'] / r['pixel_accuracy']:.3f}x "
            "its own"
        )
    write_result_file(
        args.json,
        ResultFile(
            benchmark="bench_quality",
            command="python benchmarks/bench_quality.py " + " ".join(sys.argv[1:]),
            machine=this_machine(),
            date=today(),
            tables=[table],
            conditions=(
                f"{len(patches)} patches of {args.data.name}, {args.folds} folds, "
                f"{args.nproc} CPU workers x 1 thread; load average {load:.1f} at the start, "
                f"{os.getloadavg()[0]:.1f} at the end (a shared machine)"
            ),
            extra={"patches": [p.name for p in patches], "candidates": results},
        ),
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
