"""Map quality on imagery the model has never seen: within-tile cross-validation and cross-scene
sets side by side, per candidate (training options + prediction options), over several seeds.

Real labelled data here is one NAIP tile: the pairs `*_naip.tif` / `*_lc.tif` of `--data`
(the Chesapeake patches of `../shared/data/chesapeake-wv`). A default picked on folds of one
tile can hurt every other tile, so each candidate is scored on:

- **within-tile CV**: folds of whole patches (`--folds`, default 2); each fold's held-out
  patches are laid side by side as one scene (`shifts.mosaic`, 64 px of nodata between them)
  and predicted;
- **shifted sets** (`shifts.SHIFTS`): the same held-out scenes under the radiometric shifts
  that differ between NAIP flights: gain (x0.85, x1.15), gamma (0.8, 1.25), per-band offsets
  (haze, over-corrected haze), and a leaf-off season's histogram. Each shifted scene is one
  "other flight" of the held-out ground; the shift is applied to the whole scene;
- **another world**: the synthetic generator's worlds as other tiles. A model trained on world
  A (`landcover synth --seed 101`) maps world B (`--seed 202`: other ground, other per-scene
  radiometry), as rendered and under every shift above.

Folds of the cross-scene views are by scene (the shifted flight, the world), never by patch
within the scene a model trained on. Every candidate is trained with `--seeds` seeds (default
3) per fold and world; the pooled scores of each seed give the mean and the spread (standard
deviation over seeds) that are printed.

A candidate is `landcover train` options and `landcover predict` options: candidates that share
the training options share their trained models, so a prediction option (e.g. test-time
adaptation) costs predictions only. `--predict-variant LABEL='--opt v'` adds, for the
reference candidate (or those of `--variants-of`), a variant NAME+LABEL with those prediction
options, e.g. `--predict-variant adabn='--adapt bn'`.

Each fold runs the product's own path: `landcover tile` (`--val-fraction 0`: every chip trains,
model.pt is the last epoch), `landcover train` as a subprocess, `landcover predict` through
the CLI's own parser in this process (one torch import for all predictions), and
`landcover evaluate`'s scoring of the map against the scene's labels.

The decision table compares each candidate with `--reference` (the current defaults) seed by
seed: a candidate wins a view when it is better on every seed. A default should change only for
a candidate that wins within-tile CV *and* the shifted sets *and* the other world.

Sized for a shared 2-core machine: 64 px chips, 15 epochs, batch 4, 1 worker; the full run
(3 training candidates x 3 seeds x 3 trainings, 8 scenes per model) takes about half an hour.
`--quick` is a smoke check (2 epochs, one seed, two candidates). Results go to
`benchmarks/results/quality.json` (`--json`; with `--quick` only when `--json` is given), from
which `docs/benchmarks/quality.md`'s tables are generated. Never asserts on time or scores;
prints ratios to the within-tile accuracy.

Usage:
    python benchmarks/bench_quality.py --data ../shared/data/chesapeake-wv [--quick]
        [--candidates NAME ...] [--seeds 0 1 2] [--predict-variant LABEL='ARGS'] [--work DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np
import numpy.typing as npt
import rasterio
import torch
from resultfile import (
    Cell,
    ResultFile,
    ResultTable,
    table_markdown,
    this_machine,
    today,
    write_result_file,
)
from shifts import SHIFTS, VIEWS, Shift, mosaic

from landcover import api
from landcover.evaluation import EvaluateConfig, evaluate_prediction, scores_from_confusion
from tiling.sources.classes import get_class_map

CLASS_MAP = "chesapeake7to5"
# The two classes every real patch has (and every synthetic world): the target mIoU.
TARGET_CLASSES = (2, 3)  # tree canopy, low vegetation
LABEL_NODATA = 15  # Chesapeake's "no data", the gap between the patches of a scene
GAP_PX = 64  # nodata between the patches of a scene: no window of 64 px sees two
WORLD_A_SEED, WORLD_B_SEED = 101, 202
WORLD_SCENES, WORLD_PX = 4, 256  # world A: 64 chips of 64 px, as many as a within-tile fold
LANDCOVER = [sys.executable, "-m", "landcover", "-q"]
# The aggregate views a decision reads, and the columns of the tables.
WITHIN = "within-tile CV"
TILE_SHIFTED = "tile, shifted"
WORLD = "world B"
WORLD_SHIFTED = "world B, shifted"


@dataclass(frozen=True, slots=True)
class Protocol:
    """How big each training is: the same for every candidate."""

    chip_px: int = 64
    epochs: int = 20
    batch_size: int = 4
    nproc: int = 1
    folds: int = 2

    def train_args(self) -> tuple[str, ...]:
        return ("--epochs", str(self.epochs), "--batch-size", str(self.batch_size))


QUICK = Protocol(epochs=2)


@dataclass(frozen=True, slots=True)
class Candidate:
    """`landcover train` options and `landcover predict` options."""

    name: str
    train_args: tuple[str, ...]
    predict_args: tuple[str, ...] = ()
    note: str = ""


def recipe(*, jitter: float, class_weights: str = "auto") -> tuple[str, ...]:
    """The training options the candidates vary, spelled out, so that a change of a default
    does not change a candidate."""
    return (
        *("--model", "small_unet", "--brightness-jitter", f"{jitter:g}"),
        *("--class-weights", class_weights),
    )


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        Candidate("jitter-0", recipe(jitter=0), note="the default before 6f21809"),
        Candidate(
            "jitter-0.2", recipe(jitter=0.2), note="the default of 6f21809, chosen on CV alone"
        ),
        Candidate(
            "jitter-0.2-unweighted",
            recipe(jitter=0.2, class_weights="none"),
            note="--class-weights auto was kept on within-tile CV",
        ),
    )
}
QUICK_CANDIDATES = ("jitter-0", "jitter-0.2")
# What the full run trains by default (the other candidates: --candidates NAME ...).
DEFAULT_CANDIDATES = ("jitter-0", "jitter-0.2")
REFERENCE = "jitter-0.2"  # the current defaults of `landcover train`


def with_predict_variants(
    candidates: Sequence[Candidate],
    variants: Sequence[tuple[str, tuple[str, ...]]],
    of: Sequence[str],
) -> list[Candidate]:
    """`candidates`, each named in `of` followed by its NAME+LABEL variant for every (LABEL,
    prediction options) of `variants`."""
    out: list[Candidate] = []
    for candidate in candidates:
        out.append(candidate)
        if candidate.name not in of:
            continue
        for label, args in variants:
            out.append(
                replace(
                    candidate,
                    name=f"{candidate.name}+{label}",
                    predict_args=(*candidate.predict_args, *args),
                    note=f"{candidate.name} predicted with {' '.join(args)}",
                )
            )
    return out


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


@dataclass(frozen=True, slots=True)
class Scene:
    """One predicted scene: `group` is the column it is pooled into besides its own view."""

    name: str
    view: str
    group: str
    image: Path
    labels: Path


def write_scene(
    pairs: Sequence[tuple[Path, Path]], shift: Shift | None, out_dir: Path, name: str
) -> tuple[Path, Path]:
    """The (image, labels) pairs laid side by side as one scene (`mosaic`), the image under
    `shift`, written as GeoTIFFs on the first image's grid origin; their paths."""
    images, labels = [], []
    with rasterio.open(pairs[0][0]) as first:
        profile, label_profile = first.profile, None
    for image_path, label_path in pairs:
        with rasterio.open(image_path) as src:
            images.append(src.read())
        with rasterio.open(label_path) as src:
            labels.append(src.read())
            label_profile = label_profile or src.profile
    pixels = mosaic(images, GAP_PX, 0)
    if shift is not None:
        pixels = shift.apply(pixels)
    truth = mosaic(labels, GAP_PX, LABEL_NODATA)
    out_dir.mkdir(parents=True, exist_ok=True)
    image_out, labels_out = out_dir / f"{name}.tif", out_dir / f"{name}_lc.tif"
    size = {"width": pixels.shape[-1], "height": pixels.shape[-2]}
    with rasterio.open(image_out, "w", **{**profile, **size}) as dst:
        dst.write(pixels)
    assert label_profile is not None
    with rasterio.open(labels_out, "w", **{**label_profile, **size, "nodata": LABEL_NODATA}) as dst:
        dst.write(truth)
    return image_out, labels_out


def shifts_of(index: int) -> list[Shift]:
    """The shifted sets of the `index`-th held-out scene: one shift per view, the views' shifts
    taken in turn (fold 0 darker, fold 1 brighter, ...), so that every view holds both of its
    directions over the folds at the cost of one prediction per view and scene."""
    chosen = []
    for view in VIEWS:
        of_view = [s for s in SHIFTS if s.view == view]
        chosen.append(of_view[index % len(of_view)])
    return chosen


def held_out_scenes(
    pairs: Sequence[tuple[Path, Path]],
    out_dir: Path,
    *,
    index: int,
    unshifted: str,
    shifted: str,
    per_view: bool,
    write: bool = True,
) -> list[Scene]:
    """The held-out pairs as one unshifted scene (view `unshifted`) and one scene per view of
    `shifts_of(index)`, pooled into `shifted`; with `per_view`, each shifted scene also counts
    in its view's own column (the tile's gain, gamma, offsets and season columns). Without
    `write`, the scenes a run wrote before into `out_dir`."""
    scenes = []
    for shift in (None, *shifts_of(index)):
        name = "unshifted" if shift is None else shift.name
        if write:
            image, labels = write_scene(pairs, shift, out_dir, name)
        else:
            image, labels = out_dir / f"{name}.tif", out_dir / f"{name}_lc.tif"
        if shift is None:
            scenes.append(Scene(name, unshifted, unshifted, image, labels))
        else:
            view = shift.view if per_view else shifted
            scenes.append(Scene(name, view, shifted, image, labels))
    return scenes


@dataclass(frozen=True, slots=True)
class Dataset:
    """What one training sees (a chip store) and the scenes its models are scored on."""

    name: str
    store: Path
    scenes: list[Scene]


def cli(argv: Sequence[str]) -> None:
    """Run `landcover ARGV` in this process through the CLI's own parser (its output
    dropped); a failure ends the benchmark with the command's one line."""
    from landcover.cli.app import main as landcover_main

    with contextlib.redirect_stdout(io.StringIO()):
        try:
            landcover_main.main(["-q", *argv], standalone_mode=False)
        except click.ClickException as exc:  # the command's one line (not picklable itself)
            message = exc.format_message()
            raise SystemExit(f"landcover {shlex.join(argv)} failed: {message}") from None
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise SystemExit(f"landcover {shlex.join(argv)} failed (exit {exc.code})") from None


def prepare_datasets(
    patches: Sequence[Patch], protocol: Protocol, work: Path, *, reuse: bool
) -> list[Dataset]:
    """The chip store and scenes of every within-tile fold, and of world A -> world B. With
    `reuse`, those a run with the same patches, folds and chip size wrote into `work` before
    are kept as they are (a run that adds prediction variants may go on beside one that
    trains on them)."""
    marker = work / "data" / "prepared.json"
    made = {
        "patches": [p.name for p in patches],
        "folds": protocol.folds,
        "chip_px": protocol.chip_px,
    }
    write = not (reuse and marker.is_file() and json.loads(marker.read_text()) == made)
    if write:
        marker.unlink(missing_ok=True)
    datasets = []
    for fold, (train_ids, held_ids) in enumerate(fold_split(len(patches), protocol.folds)):
        folder = work / "data" / f"fold{fold}"
        store = folder / f"chips{protocol.chip_px}.zarr"
        train = [patches[i] for i in train_ids]
        if write:
            api.tile(
                [p.image for p in train],
                store,
                labels=[p.labels for p in train],
                chip_size=protocol.chip_px,
                val_fraction=0.0,
                class_map=CLASS_MAP,
                overwrite=True,
            )
        held = [(patches[i].image, patches[i].labels) for i in held_ids]
        scenes = held_out_scenes(
            held,
            folder / "scenes",
            index=fold,
            unshifted=WITHIN,
            shifted=TILE_SHIFTED,
            per_view=True,
            write=write,
        )
        datasets.append(Dataset(f"tile fold {fold}", store, scenes))
    worlds = work / "data" / "worlds"
    for label, seed in (("A", WORLD_A_SEED), ("B", WORLD_B_SEED)) if write else ():
        cli(
            [
                *("synth", str(worlds / label), "--scenes", str(WORLD_SCENES)),
                *("--size", str(WORLD_PX), "--seed", str(seed)),
            ]
        )
    store = worlds / f"A-chips{protocol.chip_px}.zarr"
    if write:
        api.tile(
            sorted((worlds / "A" / "naip").glob("*.tif")),
            store,
            labels=sorted((worlds / "A" / "labels").glob("*.tif")),
            chip_size=protocol.chip_px,
            val_fraction=0.0,
            class_map=CLASS_MAP,
            overwrite=True,
        )
    images = sorted((worlds / "B" / "naip").glob("*.tif"))
    held = [(i, worlds / "B" / "labels" / f"{i.stem}_lc.tif") for i in images]
    scenes = held_out_scenes(
        held,
        worlds / "B-scenes",
        index=0,
        unshifted=WORLD,
        shifted=WORLD_SHIFTED,
        per_view=False,
        write=write,
    )
    datasets.append(Dataset("world A -> B", store, scenes))
    if write:
        marker.write_text(json.dumps(made))
    return datasets


@dataclass(slots=True)
class Trained:
    """A trained model and what it cost."""

    model: Path
    cpu_s: float
    wall_s: float


def train_model(argv: Sequence[str], store: Path, run_dir: Path, *, reuse: bool) -> Trained:
    """`landcover train STORE --out RUN_DIR ARGV`: in this process through the CLI when ARGV
    asks for `--nproc 1` (the command trains in its own process then), else as a subprocess
    that launches the workers. With `reuse`, a run dir that holds a model trained with the
    same argv is kept (a rerun with the same `--work` adds prediction variants without
    training again)."""
    stamp, wall_path = run_dir / "bench-argv.json", run_dir / "bench-wall-s.txt"
    full = ["train", str(store), "--out", str(run_dir), *argv]
    done_before = stamp.is_file() and json.loads(stamp.read_text()) == full
    if reuse and done_before and (run_dir / "model.pt").is_file() and wall_path.is_file():
        return Trained(run_dir / "model.pt", train_cpu_s(run_dir), float(wall_path.read_text()))
    start = time.perf_counter()
    if "--nproc" in argv and argv[argv.index("--nproc") + 1] == "1":
        cli([*full, "--overwrite"])
    else:
        done = subprocess.run(
            [*LANDCOVER, *full, "--overwrite"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"landcover {shlex.join(full)} failed:\n{done.stderr[-3000:]}")
    wall_s = time.perf_counter() - start
    stamp.write_text(json.dumps(full))
    wall_path.write_text(f"{wall_s:.3f}")
    return Trained(run_dir / "model.pt", train_cpu_s(run_dir), wall_s)


def train_cpu_s(run_dir: Path) -> float:
    """CPU seconds of all workers over all epochs (metrics.jsonl)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sum(float(json.loads(line)["epoch_cpu_s"]) for line in lines)


def predict_confusion(
    model: Path, scene: Scene, predict_args: Sequence[str], out: Path, reuse: bool = False
) -> Any:
    """`landcover predict` of `scene` with `predict_args`, scored against its labels: the
    confusion counts (truth rows x predicted columns). With `reuse`, a map that this model
    predicted with the same argv before (a stamp beside it, written after the map) is scored
    again instead of predicted again."""
    argv = ["predict", str(model), str(scene.image), "--out", str(out), "--overwrite",
            "--no-quicklook", *predict_args]  # fmt: skip
    stamp = out.with_name(out.name + ".argv.json")
    fresh = stamp.is_file() and stamp.stat().st_mtime >= model.stat().st_mtime
    if not (reuse and fresh and out.is_file() and json.loads(stamp.read_text()) == argv):
        stamp.unlink(missing_ok=True)
        cli(argv)
        stamp.write_text(json.dumps(argv))
    result = evaluate_prediction(EvaluateConfig(str(out), (str(scene.labels),)))
    return result.confusion


def scores(confusion: npt.NDArray[np.int64]) -> dict[str, float]:
    """Pixel accuracy and mIoU over tree canopy and low vegetation of pooled counts."""
    evaluation = scores_from_confusion(
        confusion,
        get_class_map(CLASS_MAP),
        prediction="pooled",
        truth=(),
        truth_class_map=CLASS_MAP,
    )
    target = [c.iou or 0.0 for c in evaluation.classes if c.code in TARGET_CLASSES]
    return {"accuracy": float(evaluation.pixel_accuracy), "target_miou": float(np.mean(target))}


COLUMNS = (WITHIN, *VIEWS, TILE_SHIFTED, WORLD, WORLD_SHIFTED)


def pooled_columns(
    scene_confusions: Iterable[tuple[Scene, Any]],
) -> dict[str, npt.NDArray[np.int64]]:
    """Confusion counts of every column of the tables: each scene's own view, and its group."""
    k = get_class_map(CLASS_MAP).num_classes - 1
    pooled = {c: np.zeros((k, k), dtype=np.int64) for c in COLUMNS}
    for scene, confusion in scene_confusions:
        pooled[scene.view] += confusion
        if scene.group != scene.view:
            pooled[scene.group] += confusion
    return pooled


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return float(np.mean(values)), spread


def verdict(deltas: Sequence[float]) -> str:
    """'wins' when better than the reference on every seed, 'loses' when worse on every seed,
    else 'tie' (within the spread over seeds)."""
    if deltas and min(deltas) > 0:
        return "wins"
    if deltas and max(deltas) < 0:
        return "loses"
    return "tie"


DECISION_VIEWS = (WITHIN, TILE_SHIFTED, WORLD, WORLD_SHIFTED)


def decide(
    per_seed: dict[str, list[dict[str, dict[str, float]]]], reference: str
) -> dict[str, Any]:
    """Per candidate other than `reference`: the per-seed accuracy differences to it in every
    decision view, their mean, the verdict per view, and whether it wins on both within-tile
    CV and every cross-scene view (what a default change needs). Seeds pair by position."""
    out: dict[str, Any] = {}
    ref = per_seed[reference]
    for name, runs in per_seed.items():
        if name == reference:
            continue
        views = {}
        for view in DECISION_VIEWS:
            deltas = [
                r[view]["accuracy"] - b[view]["accuracy"] for r, b in zip(runs, ref, strict=True)
            ]
            views[view] = {
                "deltas": deltas,
                "mean": float(np.mean(deltas)),
                "verdict": verdict(deltas),
            }
        out[name] = {
            "views": views,
            "wins_both": all(v["verdict"] == "wins" for v in views.values()),
        }
    return out


def cell(values: Sequence[float]) -> str:
    mean, spread = mean_spread(values)
    return f"{mean:.3f} ± {spread:.3f}"


def score_tables(
    candidates: Sequence[Candidate],
    per_seed: dict[str, list[dict[str, dict[str, float]]]],
    costs: dict[str, dict[str, float]],
    seeds: int,
) -> list[ResultTable]:
    """The accuracy and mIoU tables: one row per candidate, mean ± spread over seeds."""
    tables = []
    for metric, title in (
        ("accuracy", "pixel accuracy"),
        ("target_miou", "mIoU tree canopy + low vegetation"),
    ):
        rows: list[list[Cell]] = []
        for c in candidates:
            runs = per_seed[c.name]
            rows.append(
                [c.name, " ".join(c.train_args), " ".join(c.predict_args) or "(defaults)"]
                + [cell([r[col][metric] for r in runs]) for col in COLUMNS]
                + [round(costs[c.name]["train_cpu_s"])]
            )
        tables.append(
            ResultTable(
                name=metric.replace("target_", ""),
                title=f"{title.capitalize()}, mean ± standard deviation over {seeds} seeds",
                columns=[
                    "candidate",
                    "training options",
                    "prediction options",
                    *COLUMNS,
                    "training CPU s per seed, all folds",
                ],
                rows=rows,
                align=["left"] * 3 + ["right"] * (len(COLUMNS) + 1),
                note=(
                    "within-tile CV: held-out patches of the tile the model trained on; gain, "
                    "gamma, offsets, season: the same patches under that flight's shift; tile, "
                    "shifted: all those pooled; world B: a synthetic world the model (trained "
                    "on world A) never saw, then under every shift."
                ),
            )
        )
    return tables


def decision_table(decisions: dict[str, Any], reference: str) -> ResultTable:
    """Per candidate: mean accuracy difference to the reference and its verdict per view."""
    rows: list[list[Cell]] = []
    for name, d in decisions.items():
        views = d["views"]
        row: list[Cell] = [name]
        row += [f"{views[v]['mean']:+.3f} {views[v]['verdict']}" for v in DECISION_VIEWS]
        rows.append([*row, "yes" if d["wins_both"] else "no"])
    return ResultTable(
        name="decision",
        title=f"Against {reference} (the current defaults), accuracy difference, seed by seed",
        columns=["candidate", *DECISION_VIEWS, "wins within-tile and cross-scene"],
        rows=rows,
        align=["left"] + ["right"] * (len(DECISION_VIEWS) + 1),
        note="wins / loses: better / worse on every seed; tie: otherwise.",
    )


@dataclass(frozen=True, slots=True)
class Job:
    """One seed of one training recipe: its models (one per dataset) and the predictions of
    every candidate that shares the recipe."""

    train_args: tuple[str, ...]
    seed: int
    candidates: tuple[Candidate, ...]


@dataclass(slots=True)
class JobResult:
    """Per candidate of a job: its pooled scores and counts per column, its prediction time;
    and the training CPU seconds of the job's models."""

    seed: int
    scores: dict[str, dict[str, dict[str, float]]]
    confusions: dict[str, dict[str, list[list[int]]]]
    predict_s: dict[str, float]
    train_cpu_s: float


def run_job(
    job: Job, datasets: Sequence[Dataset], protocol: Protocol, work: Path, reuse: bool
) -> JobResult:
    """Train the job's recipe on every dataset with its seed, predict every scene with each
    candidate's prediction options, and pool the counts."""
    torch.set_num_threads(1)
    tag = hashlib.sha256(shlex.join(job.train_args).encode()).hexdigest()[:12]
    found: dict[str, list[tuple[Scene, Any]]] = {c.name: [] for c in job.candidates}
    predict_s = dict.fromkeys(found, 0.0)
    cpu_s = 0.0
    for index, data in enumerate(datasets):
        argv = [
            *("--nproc", str(protocol.nproc), "--threads", "1", "--tracking", "none"),
            *("--seed", str(job.seed), *protocol.train_args(), *job.train_args),
        ]
        run_dir = work / "runs" / tag / f"seed{job.seed}" / f"d{index}"
        trained = train_model(argv, data.store, run_dir, reuse=reuse)
        cpu_s += trained.cpu_s
        print(
            f"  {job.candidates[0].name} seed {job.seed} {data.name}: trained in "
            f"{trained.cpu_s:.0f} CPU s / {trained.wall_s:.0f} s wall",
            flush=True,
        )
        for c in job.candidates:
            start = time.perf_counter()
            for scene in data.scenes:
                out = run_dir / "maps" / f"{c.name}-{scene.name}.tif"
                confusion = predict_confusion(trained.model, scene, c.predict_args, out, reuse)
                found[c.name].append((scene, confusion))
            predict_s[c.name] += time.perf_counter() - start
    result = JobResult(job.seed, {}, {}, predict_s, cpu_s)
    for name, scene_confusions in found.items():
        pooled = pooled_columns(scene_confusions)
        result.scores[name] = {col: scores(m) for col, m in pooled.items()}
        result.confusions[name] = {col: m.tolist() for col, m in pooled.items()}
        row = result.scores[name]
        print(
            f"  {name} seed {job.seed}: accuracy within-tile {row[WITHIN]['accuracy']:.3f}, "
            f"tile shifted {row[TILE_SHIFTED]['accuracy']:.3f}, "
            f"world B {row[WORLD]['accuracy']:.3f}, "
            f"shifted {row[WORLD_SHIFTED]['accuracy']:.3f}",
            flush=True,
        )
    return result


@dataclass(slots=True)
class Run:
    """What the protocol measured: per candidate, per seed (in seed order)."""

    per_seed: dict[str, list[dict[str, dict[str, float]]]] = field(default_factory=dict)
    costs: dict[str, dict[str, float]] = field(default_factory=dict)
    confusions: dict[str, list[dict[str, list[list[int]]]]] = field(default_factory=dict)


def run_protocol(
    candidates: Sequence[Candidate],
    datasets: Sequence[Dataset],
    *,
    protocol: Protocol,
    seeds: Sequence[int],
    work: Path,
    reuse: bool,
    jobs: int,
) -> Run:
    """Every (training recipe, seed) as a job, `jobs` of them at a time in worker processes
    (one torch thread each); candidates that share a recipe share its models."""
    recipes: dict[tuple[str, ...], list[Candidate]] = {}
    for c in candidates:
        recipes.setdefault(c.train_args, []).append(c)
    work_list = [Job(args, seed, tuple(cs)) for seed in seeds for args, cs in recipes.items()]
    if jobs > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [
                pool.submit(run_job, job, datasets, protocol, work, reuse) for job in work_list
            ]
            results = [f.result() for f in futures]
    else:
        results = [run_job(job, datasets, protocol, work, reuse) for job in work_list]
    run = Run()
    for c in candidates:
        mine = sorted((r for r in results if c.name in r.scores), key=lambda r: seeds.index(r.seed))
        run.per_seed[c.name] = [r.scores[c.name] for r in mine]
        run.confusions[c.name] = [r.confusions[c.name] for r in mine]
        run.costs[c.name] = {
            "train_cpu_s": float(np.mean([r.train_cpu_s for r in mine])),
            "predict_wall_s": sum(r.predict_s[c.name] for r in mine),
        }
    return run


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """LABEL='ARGS' of `--predict-variant`."""
    label, sep, args = text.partition("=")
    if not sep or not label or not args.strip():
        raise SystemExit(f"--predict-variant {text!r}: give LABEL='--option value ...'")
    return label, tuple(shlex.split(args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="*_naip.tif / *_lc.tif pairs")
    parser.add_argument("--quick", action="store_true", help="smoke check: 2 epochs, 1 seed")
    parser.add_argument("--candidates", nargs="+", metavar="NAME")
    parser.add_argument("--predict-variant", action="append", default=[], metavar="LABEL=ARGS")
    parser.add_argument(
        "--variants-of",
        nargs="+",
        metavar="NAME",
        help="candidates that get the --predict-variant variants (default: --reference)",
    )
    parser.add_argument("--reference", default=REFERENCE, help="the current defaults' candidate")
    parser.add_argument("--seeds", type=int, nargs="+", help="training seeds (default 0 1 2)")
    parser.add_argument("--folds", type=int, help="within-tile folds (default 2)")
    parser.add_argument("--epochs", type=int, help="epochs of every training (default 15)")
    parser.add_argument(
        "--jobs", type=int, default=2, help="(recipe, seed) jobs at a time (default 2)"
    )
    parser.add_argument("--work", type=Path, help="scratch directory, reused by a rerun")
    parser.add_argument("--json", type=Path, help="result file (default results/quality.json)")
    args = parser.parse_args()
    if args.data is None:
        parser.error("--data DIR is required (e.g. ../shared/data/chesapeake-wv)")
    protocol = QUICK if args.quick else Protocol()
    protocol = replace(
        protocol,
        folds=args.folds or protocol.folds,
        epochs=args.epochs or protocol.epochs,
    )
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    names = args.candidates or list(QUICK_CANDIDATES if args.quick else DEFAULT_CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidate {unknown[0]!r}; choose from {', '.join(CANDIDATES)}")
    if args.reference not in names:
        names.insert(0, args.reference)
    variants = [parse_variant(v) for v in args.predict_variant]
    of = args.variants_of or [args.reference]
    candidates = with_predict_variants([CANDIDATES[n] for n in names], variants, of)
    json_path = args.json
    if json_path is None and not args.quick:
        json_path = Path(__file__).parent / "results" / "quality.json"
    patches = find_patches(args.data)
    fold_split(len(patches), protocol.folds)  # a bad --folds fails before any training
    load = os.getloadavg()[0]
    print(
        f"{len(patches)} patches in {protocol.folds} folds + world A -> B; "
        f"{len(candidates)} candidates x {len(seeds)} seeds; {protocol}; "
        f"load average {load:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    # One torch thread: on a loaded machine, threads that wait for each other spend several
    # times the CPU of one (predict of a held-out scene: 0.7 CPU s with one, 5.8 with two).
    torch.set_num_threads(1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as scratch:
        work = args.work or Path(scratch)
        datasets = prepare_datasets(patches, protocol, work, reuse=args.work is not None)
        run = run_protocol(
            candidates,
            datasets,
            protocol=protocol,
            seeds=seeds,
            work=work,
            reuse=args.work is not None,
            jobs=args.jobs,
        )
    wall_s = time.perf_counter() - start
    decisions = decide(run.per_seed, args.reference)
    tables = [
        *score_tables(candidates, run.per_seed, run.costs, len(seeds)),
        decision_table(decisions, args.reference),
    ]
    for table in tables:
        print(f"\n## {table.title}\n")
        print(table_markdown(table))
    print()
    for c in candidates:
        runs = run.per_seed[c.name]
        within = np.mean([r[WITHIN]["accuracy"] for r in runs])
        ratios = ", ".join(
            f"{col} {np.mean([r[col]['accuracy'] for r in runs]) / within:.3f}x"
            for col in (TILE_SHIFTED, WORLD, WORLD_SHIFTED)
        )
        print(f"{c.name}: of its within-tile accuracy ({within:.3f}): {ratios}")
    print(f"\nwall time {wall_s / 60:.1f} min; load average {os.getloadavg()[0]:.1f} at the end")
    if json_path is None:
        return
    write_result_file(
        json_path,
        ResultFile(
            benchmark="bench_quality",
            command="python benchmarks/bench_quality.py " + shlex.join(sys.argv[1:]),
            machine=this_machine(),
            date=today(),
            tables=tables,
            conditions=(
                f"{len(patches)} patches of {args.data.name} in {protocol.folds} folds, "
                f"synthetic worlds {WORLD_A_SEED} -> {WORLD_B_SEED} ({WORLD_SCENES} scenes of "
                f"{WORLD_PX} px); {protocol.chip_px} px chips, {protocol.epochs} epochs, batch "
                f"{protocol.batch_size}, {protocol.nproc} worker x 1 thread; seeds {seeds}; "
                f"wall time {wall_s / 60:.1f} min; load average {load:.1f} at the start, "
                f"{os.getloadavg()[0]:.1f} at the end (a shared 2-core machine)"
            ),
            extra={
                "patches": [p.name for p in patches],
                "protocol": {**vars_of(protocol), "seeds": seeds, "wall_s": wall_s},
                "shifts": [
                    {"name": s.name, "view": s.view, "description": s.description} for s in SHIFTS
                ],
                "candidates": [
                    {
                        "name": c.name,
                        "train_args": list(c.train_args),
                        "predict_args": list(c.predict_args),
                        "note": c.note,
                        "per_seed": run.per_seed[c.name],
                        "costs": run.costs[c.name],
                        "confusions": run.confusions[c.name],
                    }
                    for c in candidates
                ],
                "decisions": decisions,
            },
        ),
    )
    print(f"wrote {json_path}")


def vars_of(protocol: Protocol) -> dict[str, Any]:
    return {name: getattr(protocol, name) for name in Protocol.__slots__}  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
