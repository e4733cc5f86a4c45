"""Scaling report: read training run directories, tabulate epoch time against workers, fit a
power law, project to large clusters with a ring model, and write PNG plots, a Markdown page
and a self-contained HTML page.

A run's epoch time is robust to warm-up: the median of its per-epoch training times over every
epoch but the first when it has two or more (the first pays for allocator, cuDNN autotuning
and page-cache warm-up). The one-time shard load is reported on its own, never in epoch time.
Runs are grouped into curves by device, then by communication mode (compression, block
momentum), model and per-worker batch; one curve never mixes devices.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import os
import re
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cluster.vmsizes import Network, network_for
from landcover.errors import OutputExistsError, ReportError
from landcover.projection import (
    DEFAULT_NETWORK,
    ComputeFit,
    MeasuredPoint,
    PowerLawFit,
    ProjectedPoint,
    RingModel,
    describe_network,
    fit_compute_per_sample,
    fit_power_law,
    project,
)

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
SWEEP_FILE = "sweep.json"
MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
DEFAULT_PROJECT_TO = (8, 16, 64, 148)
TUTORIAL_EXPONENT = -0.80  # the exponent of the original Batch AI tutorial's scaling figure

# field → (kind, requirement) for every metrics.jsonl line the report reads
_REQUIRED: dict[str, str] = {
    "epoch": "int>=1",
    "world_size": "int>=1",
    "epoch_time_s": "number>0",
    "load_time_s": "number>=0",
    "steps": "int>=1",
    "batch_size": "int>=1",
    "comm_bytes_per_step": "number>=0",
    "device": "str",
    "compression": "str",
    "block_momentum": "bool",
}
_OPTIONAL: dict[str, str] = {
    "nodes": "int>=1",
    "threads_per_worker": "int>=1",
    "samples_per_s": "number>0",
    "model": "str",
    "host": "str",
}
# fields that must not change between the epochs of one run
_CONSTANT = ("world_size", "device", "compression", "block_momentum", "batch_size", "nodes")
_SWEEP_PATH_KEYS = ("run_dir", "dir", "path", "out", "name")
_VM_SIZE_KEYS = ("vmSize", "vm_size", "vmsize")
_CORES_KEYS = ("cores", "cpu_count", "host_cores", "logical_cpus", "num_cpus")


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run directory reduced to the numbers a scaling curve needs."""

    run_dir: Path
    label: str
    device: str
    compression: str
    block_momentum: bool
    model: str | None
    batch_size: int
    workers: int
    nodes: int
    threads_per_worker: int | None
    epochs: tuple[int, ...]
    epochs_used: tuple[int, ...]
    epoch_times_s: tuple[float, ...]
    epoch_time_s: float  # median over epochs_used
    load_time_s: float
    steps: int
    samples_per_epoch: int
    samples_per_s: float | None
    comm_bytes_per_step: float
    vm_size: str | None
    cores: int | None
    oversubscribed: bool | None  # None: unknown (no sweep.json and no core count)
    oversubscribed_source: str | None

    @property
    def mode(self) -> str:
        return self.compression + (" + block momentum" if self.block_momentum else "")

    @property
    def step_time_s(self) -> float:
        return self.epoch_time_s / self.steps


@dataclass(frozen=True, slots=True)
class CurveKey:
    """What makes runs comparable points of one curve."""

    device: str
    compression: str
    block_momentum: bool
    model: str | None
    batch_size: int

    @property
    def mode(self) -> str:
        return self.compression + (" + block momentum" if self.block_momentum else "")


@dataclass(frozen=True, slots=True)
class ScalingRow:
    """One run in its curve: speed-up and efficiency against the curve's smallest run."""

    run: RunSummary
    speedup: float
    ideal_speedup: float

    @property
    def efficiency(self) -> float:
        return self.speedup / self.ideal_speedup


@dataclass(frozen=True, slots=True)
class CurveProjection:
    """The ring-model projection of one curve (PROJECTED, not measured)."""

    model: RingModel
    network_source: str
    compute_fit: ComputeFit
    points: tuple[ProjectedPoint, ...]

    @property
    def max_abs_error(self) -> float | None:
        errors = [abs(e) for p in self.points if (e := p.relative_error) is not None]
        return max(errors) if errors else None


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    key: CurveKey
    label: str
    rows: tuple[ScalingRow, ...]
    baseline_workers: int
    fit_rows: tuple[ScalingRow, ...]  # the rows the power law and projection are fitted to
    fit: PowerLawFit | None
    projection: CurveProjection | None


@dataclass(frozen=True, slots=True)
class ScalingReport:
    curves: tuple[ScalingCurve, ...]
    devices: tuple[str, ...]
    project_to: tuple[int, ...]
    notes: tuple[str, ...]

    def curves_of(self, device: str) -> tuple[ScalingCurve, ...]:
        return tuple(c for c in self.curves if c.key.device == device)


@dataclass(frozen=True, slots=True)
class ReportPaths:
    out_dir: Path
    markdown: Path
    html: Path
    images: tuple[Path, ...]


# ---------------------------------------------------------------------------------------------
# Reading run directories


@dataclass(frozen=True, slots=True)
class _Source:
    run_dir: Path
    label: str
    sweep_file: Path | None
    sweep_entries: tuple[Mapping[str, Any], ...]


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> list[RunSummary]:
    """Read run directories (written by `landcover train --out`) and sweep directories (a
    `sweep.json` and/or subdirectories that are runs). Raises ReportError on bad input."""
    sources: dict[Path, _Source] = {}
    for raw in paths:
        for source in _expand(Path(raw)):
            sources.setdefault(source.run_dir.resolve(), source)
    if not sources:
        raise ReportError("no run directories given; pass the --out of `landcover train` runs")
    runs = [_summarise(source) for source in sources.values()]
    logger.info("read %d runs", len(runs))
    return runs


def _expand(path: Path) -> list[_Source]:
    if path.name == METRICS_FILE and path.is_file():
        path = path.parent
    if not path.is_dir():
        raise ReportError(
            f"{path}: no such directory; pass run directories written by `landcover train --out` "
            "or a sweep directory"
        )
    if (path / METRICS_FILE).exists():
        parent_sweep = path.parent / SWEEP_FILE
        entries = _read_sweep(parent_sweep) if parent_sweep.is_file() else ()
        sweep_file = parent_sweep if entries else None
        return [_Source(path, str(path), sweep_file, entries)]
    sweep_file = path / SWEEP_FILE
    entries = _read_sweep(sweep_file) if sweep_file.is_file() else ()
    run_dirs: dict[Path, Path] = {}
    for entry in entries:
        if _entry_failed(entry):
            logger.warning("%s: skipping a run the sweep marks as failed: %s", sweep_file, entry)
            continue
        run_dir = _entry_dir(path, entry)
        if run_dir is None:
            continue
        if not (run_dir / METRICS_FILE).is_file():
            raise ReportError(
                f"{run_dir}: listed in {sweep_file} but has no {METRICS_FILE}; the run did not "
                "finish an epoch: rerun it, or pass the other run directories one by one"
            )
        run_dirs.setdefault(run_dir.resolve(), run_dir)
    for child in sorted(path.iterdir()):
        if child.is_dir() and (child / METRICS_FILE).is_file():
            run_dirs.setdefault(child.resolve(), child)
    if not run_dirs:
        raise ReportError(
            f"{path}: no {METRICS_FILE} in it nor in any subdirectory; pass run directories "
            "written by `landcover train --out` (or a sweep directory holding them)"
        )
    return [
        _Source(run_dir, str(run_dir), sweep_file if entries else None, entries)
        for run_dir in run_dirs.values()
    ]


def _read_sweep(sweep_file: Path) -> tuple[Mapping[str, Any], ...]:
    data = _read_json(sweep_file)
    entries = data.get("runs") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ReportError(
            f"{sweep_file}: expected a list of run objects (or {{'runs': [...]}}); rerun "
            "`landcover scale` or delete the file to read the run subdirectories alone"
        )
    return tuple(entries)


def _entry_failed(entry: Mapping[str, Any]) -> bool:
    status = str(entry.get("status", "")).lower()
    return status in {"failed", "error", "crashed"} or entry.get("returncode") not in (None, 0)


def _entry_dir(sweep_dir: Path, entry: Mapping[str, Any]) -> Path | None:
    for key in _SWEEP_PATH_KEYS:
        value = entry.get(key)
        if isinstance(value, str) and value:
            candidate = Path(value)
            if candidate.is_absolute():
                return candidate
            # the sweep may have recorded paths relative to its own cwd, not to the sweep dir
            if (sweep_dir / candidate).exists() or not (sweep_dir / candidate.name).exists():
                return sweep_dir / candidate
            return sweep_dir / candidate.name
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); restore it or delete it"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    by_epoch: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(
                f"{path}: line {number} is not valid JSON ({exc.msg}); delete that line or "
                "rerun the training"
            ) from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}: line {number} is not a JSON object; delete that line")
        missing = [name for name in _REQUIRED if name not in record]
        if missing:
            raise ReportError(
                f"{path}: line {number} lacks {', '.join(missing)}; the report needs "
                f"{', '.join(_REQUIRED)} on every line (docs/CONTRACTS.md, metrics.jsonl)"
            )
        for name, kind in (*_REQUIRED.items(), *_OPTIONAL.items()):
            if name in record and not (name in _OPTIONAL and record[name] is None):
                _check_field(path, number, name, record[name], kind)
        by_epoch[record["epoch"]] = record  # a resumed run rewrites epochs: the last one wins
    if not by_epoch:
        raise ReportError(
            f"{path}: empty, no epoch has finished; wait for the run's first epoch or leave "
            f"{path.parent} out"
        )
    records = [by_epoch[e] for e in sorted(by_epoch)]
    for name in _CONSTANT:
        values = {json.dumps(r.get(name)) for r in records}
        if len(values) > 1:
            raise ReportError(
                f"{path}: {name} changes between epochs ({', '.join(sorted(values))}); one run "
                "directory must hold one configuration: train each in its own --out"
            )
    return records


def _check_field(path: Path, line: int, name: str, value: Any, kind: str) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        ok = isinstance(value, str) and bool(value)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind.startswith("int"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    elif kind == "number>0":
        ok = is_number and math.isfinite(value) and value > 0
    else:  # number>=0
        ok = is_number and math.isfinite(value) and value >= 0
    if not ok:
        wanted = {
            "str": "a non-empty string",
            "bool": "true or false",
            "int>=1": "an integer >= 1",
            "number>0": "a positive number",
            "number>=0": "a number >= 0",
        }[kind]
        raise ReportError(
            f"{path}: line {line}: {name} must be {wanted}, got {json.dumps(value)}; fix or "
            "delete that line"
        )


def _summarise(source: _Source) -> RunSummary:
    records = _read_metrics(source.run_dir / METRICS_FILE)
    run_file = source.run_dir / RUN_FILE
    run_info = _read_json(run_file) if run_file.is_file() else {}
    first = records[0]
    # the first epoch pays for warm-up (allocator, autotuning, page cache): leave it out
    used = records[1:] if len(records) >= 2 else records
    workers = int(first["world_size"])
    batch_size = int(first["batch_size"])
    nodes = int(first.get("nodes") or 1)
    threads = first.get("threads_per_worker")
    samples = [
        r["samples_per_s"] * r["epoch_time_s"]
        if r.get("samples_per_s")
        else r["steps"] * workers * batch_size
        for r in used
    ]
    entry = _match_sweep_entry(source, workers)
    cores = _as_positive_int(entry.get("cores")) if entry else None
    if cores is None:
        cores = _as_positive_int(_find_key(run_info, _CORES_KEYS))
    oversubscribed: bool | None = None
    oversubscribed_source: str | None = None
    if entry is not None and isinstance(entry.get("oversubscribed"), bool):
        oversubscribed, oversubscribed_source = entry["oversubscribed"], SWEEP_FILE
    elif cores is not None and threads is not None:
        workers_per_host = math.ceil(workers / nodes)
        oversubscribed = workers_per_host * int(threads) > cores
        oversubscribed_source = f"workers×threads {workers_per_host}×{threads} vs {cores} cores"
    vm_size = _find_key(run_info, _VM_SIZE_KEYS)
    samples_per_s = [float(r["samples_per_s"]) for r in used if r.get("samples_per_s")]
    return RunSummary(
        run_dir=source.run_dir,
        label=source.label,
        device=str(first["device"]),
        compression=str(first["compression"]),
        block_momentum=bool(first["block_momentum"]),
        model=first.get("model"),
        batch_size=batch_size,
        workers=workers,
        nodes=nodes,
        threads_per_worker=int(threads) if threads is not None else None,
        epochs=tuple(int(r["epoch"]) for r in records),
        epochs_used=tuple(int(r["epoch"]) for r in used),
        epoch_times_s=tuple(float(r["epoch_time_s"]) for r in records),
        epoch_time_s=statistics.median(float(r["epoch_time_s"]) for r in used),
        load_time_s=max(float(r["load_time_s"]) for r in records),
        steps=round(statistics.median(int(r["steps"]) for r in used)),
        samples_per_epoch=max(1, round(statistics.median(samples))),
        samples_per_s=statistics.median(samples_per_s) if samples_per_s else None,
        comm_bytes_per_step=statistics.median(float(r["comm_bytes_per_step"]) for r in used),
        vm_size=vm_size if isinstance(vm_size, str) and vm_size else None,
        cores=cores,
        oversubscribed=oversubscribed,
        oversubscribed_source=oversubscribed_source,
    )


def _match_sweep_entry(source: _Source, workers: int) -> Mapping[str, Any] | None:
    if source.sweep_file is None:
        return None
    sweep_dir = source.sweep_file.parent
    resolved = source.run_dir.resolve()
    for entry in source.sweep_entries:
        run_dir = _entry_dir(sweep_dir, entry)
        if run_dir is not None and run_dir.resolve() == resolved:
            return entry
    by_workers = [
        e
        for e in source.sweep_entries
        if _entry_dir(sweep_dir, e) is None and e.get("workers") == workers
    ]
    return by_workers[0] if len(by_workers) == 1 else None


def _find_key(data: Any, keys: Sequence[str], depth: int = 3) -> Any:
    """The value of the first of `keys` in a JSON object, searching nested objects breadth
    first (run.json is written by another package: accept the key wherever it sits)."""
    level = [data]
    for _ in range(depth + 1):
        nested: list[Any] = []
        for obj in level:
            if isinstance(obj, dict):
                for key in keys:
                    if obj.get(key) is not None:
                        return obj[key]
                nested.extend(v for v in obj.values() if isinstance(v, dict))
        level = nested
    return None


def _as_positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


# ---------------------------------------------------------------------------------------------
# Curves, fits, projections


def curve_key(run: RunSummary) -> CurveKey:
    return CurveKey(run.device, run.compression, run.block_momentum, run.model, run.batch_size)


def scaling_table(runs: Sequence[RunSummary]) -> list[ScalingRow]:
    """Every run with its speed-up and efficiency against the smallest run of its curve
    (same device, mode, model and batch), sorted by device, mode and workers."""
    rows: list[ScalingRow] = []
    for _key, members in _group(runs).items():
        rows.extend(_rows_of(members))
    return rows


def _group(runs: Sequence[RunSummary]) -> dict[CurveKey, list[RunSummary]]:
    groups: dict[CurveKey, list[RunSummary]] = {}
    for run in sorted(runs, key=lambda r: (*_sort_key(curve_key(r)), r.workers, r.label)):
        groups.setdefault(curve_key(run), []).append(run)
    return groups


def _sort_key(key: CurveKey) -> tuple[str, bool, str, str, int]:
    return key.device, key.block_momentum, key.compression, key.model or "", key.batch_size


def _rows_of(members: Sequence[RunSummary]) -> list[ScalingRow]:
    baseline_workers = min(r.workers for r in members)
    baseline_s = statistics.median(r.epoch_time_s for r in members if r.workers == baseline_workers)
    return [
        ScalingRow(r, baseline_s / r.epoch_time_s, r.workers / baseline_workers) for r in members
    ]


def build_scaling_report(
    runs: Sequence[RunSummary],
    *,
    project_to: Sequence[int] = DEFAULT_PROJECT_TO,
    network: Network | None = None,
) -> ScalingReport:
    """Curves, power-law fits and ring-model projections of `runs`. `network` overrides the
    network looked up from the runs' vmSize (default: DEFAULT_NETWORK)."""
    if not runs:
        raise ReportError("no runs to report on; pass run directories of `landcover train`")
    bad = [n for n in project_to if n < 1]
    if bad:
        raise ReportError(f"--project-to {bad[0]}: worker counts must be >= 1")
    notes: list[str] = []
    curves: list[ScalingCurve] = []
    groups = _group(runs)
    for key, members in groups.items():
        siblings = [k for k in groups if k.device == key.device]
        rows = tuple(_rows_of(members))
        fit_rows = tuple(r for r in rows if r.run.oversubscribed is not True)
        if len({r.run.workers for r in fit_rows}) < 2 and len(fit_rows) < len(rows):
            fit_rows = rows
            notes.append(
                f"{key.device}, {key.mode}: fewer than two worker counts are not oversubscribed, "
                "so the fit and projection use the oversubscribed runs too."
            )
        fit = None
        if len({r.run.workers for r in fit_rows}) >= 2:
            fit = fit_power_law(
                [r.run.workers for r in fit_rows], [r.run.epoch_time_s for r in fit_rows]
            )
        projection = _project_curve(key, fit_rows, project_to, network, notes)
        curves.append(
            ScalingCurve(
                key=key,
                label=_label(key, siblings),
                rows=rows,
                baseline_workers=min(r.run.workers for r in rows),
                fit_rows=fit_rows,
                fit=fit,
                projection=projection,
            )
        )
    devices = tuple(dict.fromkeys(c.key.device for c in curves))
    return ScalingReport(tuple(curves), devices, tuple(sorted(set(project_to))), tuple(notes))


def _label(key: CurveKey, siblings: Sequence[CurveKey]) -> str:
    label = key.mode
    if len({k.model for k in siblings}) > 1:
        label = f"{key.model or '?'} · {label}"
    if len({k.batch_size for k in siblings}) > 1:
        label = f"{label} · batch {key.batch_size}"
    return label


def _project_curve(
    key: CurveKey,
    fit_rows: Sequence[ScalingRow],
    project_to: Sequence[int],
    override: Network | None,
    notes: list[str],
) -> CurveProjection:
    runs = [r.run for r in fit_rows]
    where = f"{key.device}, {key.mode}"
    network, source = _choose_network(runs, override, where, notes)
    multi = [r.comm_bytes_per_step for r in runs if r.workers > 1]
    payload = statistics.median(multi or [r.comm_bytes_per_step for r in runs])
    if payload == 0:
        notes.append(
            f"{where}: no run measured any bytes communicated per step, so the projection "
            "has no communication cost; measure a run with 2 or more workers."
        )
    points = [MeasuredPoint(r.workers, r.steps, r.batch_size, r.epoch_time_s) for r in runs]
    compute = fit_compute_per_sample(points, payload_bytes=payload, network=network)
    if compute.clamped:
        notes.append(
            f"{where}: the modelled communication over {network.name} alone exceeds the measured "
            "epoch times (the runs talked over a faster path); compute per sample is set to 0."
        )
    model = RingModel(
        compute_per_sample_s=compute.compute_per_sample_s,
        payload_bytes=payload,
        samples_per_epoch=round(statistics.median(r.samples_per_epoch for r in runs)),
        batch_size=key.batch_size,
        network=network,
    )
    measured: dict[int, list[float]] = {}
    for r in runs:
        measured.setdefault(r.workers, []).append(r.epoch_time_s)
    points_out = project(
        model,
        [*measured, *project_to],
        baseline_workers=min(measured),
        measured={n: statistics.median(ts) for n, ts in measured.items()},
    )
    return CurveProjection(model, source, compute, points_out)


def _choose_network(
    runs: Sequence[RunSummary], override: Network | None, where: str, notes: list[str]
) -> tuple[Network, str]:
    if override is not None:
        return override, "--network"
    sizes = sorted({r.vm_size for r in runs if r.vm_size})
    if len(sizes) == 1 and (network := network_for(sizes[0])) is not None:
        return network, f"vmSize {sizes[0]} of the runs"
    if sizes:
        notes.append(
            f"{where}: vmSize {', '.join(sizes)} names no single known network; projecting "
            f"over the default {DEFAULT_NETWORK.name} (pass --network to choose)."
        )
    return DEFAULT_NETWORK, "default (no --network and no known vmSize in run.json)"


# ---------------------------------------------------------------------------------------------
# Writing: one document model rendered to Markdown and to self-contained HTML


@dataclass(frozen=True, slots=True)
class _Heading:
    level: int
    text: str


@dataclass(frozen=True, slots=True)
class _Paragraph:
    text: str


@dataclass(frozen=True, slots=True)
class _Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class _Image:
    filename: str
    alt: str


@dataclass(frozen=True, slots=True)
class _Bullets:
    items: tuple[str, ...]


_Block = _Heading | _Paragraph | _Table | _Image | _Bullets

_RUN_HEADERS = (
    *("device", "mode", "workers", "nodes", "epoch time (s)", "epochs used", "step time (s)"),
    *("speed-up", "efficiency", "load time (s)", "samples/s", "comm/step", "oversubscribed"),
    "run",
)
_PROJECTION_HEADERS = (
    *("workers", "steps/epoch", "compute (s)", "comm (s)", "PROJECTED epoch time (s)"),
    *("speed-up", "efficiency", "measured (s)", "error"),
)
_EPOCH_TIME_NOTE = (
    "Epoch time is the median of a run's per-epoch training times over every epoch but the "
    "first (warm-up) when the run has two or more epochs; it excludes validation and the "
    "one-time shard load, which has its own column. Speed-up and efficiency are against the "
    "smallest worker count of the same curve. The per-worker batch is fixed and the dataset is "
    "split across workers, so the epoch scales strongly while step time (epoch time / steps) "
    "is the weak-scaling view: ideally flat, its growth with workers is communication and "
    "contention."
)


def write_scaling_report(
    runs: Sequence[RunSummary],
    out_dir: str | os.PathLike[str],
    *,
    project_to: Sequence[int] = DEFAULT_PROJECT_TO,
    network: Network | None = None,
    overwrite: bool = False,
) -> ReportPaths:
    """Build the report of `runs` and write it to `out_dir`: PNG plots per device,
    report.md (linking the PNGs) and report.html (PNGs embedded, no external references)."""
    report = build_scaling_report(runs, project_to=project_to, network=network)
    return write_report_files(report, out_dir, overwrite=overwrite)


def write_report_files(
    report: ScalingReport, out_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> ReportPaths:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory; choose another --out")
    if not overwrite and ((out / MARKDOWN_FILE).exists() or (out / HTML_FILE).exists()):
        raise OutputExistsError(
            f"--out {out}: already holds a scaling report; pass --overwrite to replace it "
            "or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}
    figures: dict[str, tuple[str, str]] = {}
    for device, slug in _device_slugs(report.devices).items():
        curves = report.curves_of(device)
        scaling_name, projection_name = f"scaling-{slug}.png", f"projection-{slug}.png"
        images[scaling_name] = _plot_scaling(curves, device)
        images[projection_name] = _plot_projection(curves, device, report.project_to)
        figures[device] = (scaling_name, projection_name)
    for stale in [*out.glob("scaling-*.png"), *out.glob("projection-*.png")]:
        if stale.name not in images:
            stale.unlink()
    for name, data in images.items():
        _write_atomic(out / name, data)
    blocks = _document(report, figures)
    # the pages go last: a report.md/report.html on disk means its images are complete
    _write_atomic(out / MARKDOWN_FILE, render_markdown(blocks).encode())
    _write_atomic(out / HTML_FILE, _render_html(blocks, images).encode())
    logger.info("wrote the scaling report to %s", out)
    return ReportPaths(
        out_dir=out,
        markdown=out / MARKDOWN_FILE,
        html=out / HTML_FILE,
        images=tuple(out / name for name in images),
    )


def report_markdown(report: ScalingReport, *, images: bool = False) -> str:
    """The report as Markdown text (without image links unless `images`), for printing."""
    figures = (
        {
            d: (f"scaling-{s}.png", f"projection-{s}.png")
            for d, s in _device_slugs(report.devices).items()
        }
        if images
        else {}
    )
    return render_markdown(_document(report, figures))


def _device_slugs(devices: Sequence[str]) -> dict[str, str]:
    slugs: dict[str, str] = {}
    for device in devices:
        slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:60] or "device"
        candidate, i = slug, 2
        while candidate in slugs.values():
            candidate, i = f"{slug}-{i}", i + 1
        slugs[device] = candidate
    return slugs


def _document(report: ScalingReport, figures: Mapping[str, tuple[str, str]]) -> list[_Block]:
    runs = [row.run for curve in report.curves for row in curve.rows]
    blocks: list[_Block] = [
        _Heading(1, "Scaling report"),
        _Paragraph(
            f"{len(runs)} runs on {len(report.devices)} device(s): "
            + "; ".join(report.devices)
            + ". Each device has its own curves and figures; devices are never mixed."
        ),
        _Heading(2, "Measured runs"),
        _Table(
            _RUN_HEADERS,
            tuple(_run_row(curve, row) for curve in report.curves for row in curve.rows),
        ),
        _Paragraph(_EPOCH_TIME_NOTE),
        _Heading(2, "Power-law fits"),
        _Table(
            ("device", "curve", "runs fitted", "worker counts", "exponent b (t ∝ N^b)", "R²"),
            tuple(_fit_row(curve) for curve in report.curves),
        ),
        _Paragraph(
            "Least squares of log(epoch time) = a + b·log(workers). Ideal strong scaling is "
            f"b = -1; the original tutorial's figure reported b = {TUTORIAL_EXPONENT:.2f}. "
            "Oversubscribed runs (more worker threads than cores on a host) are shown hollow "
            "and left out of fits and projections."
        ),
    ]
    for device in report.devices:
        if device in figures:
            blocks.append(_Image(figures[device][0], f"Measured scaling on {device}"))
    blocks += [
        _Heading(2, "PROJECTED epoch times (ring model, not measurements)"),
        _Paragraph(
            "Model: epoch_time(N) = steps(N) · (B · compute_per_sample + comm(N)) with a fixed "
            "per-worker batch B and the epoch's S samples split over N workers (strong scaling "
            "of the epoch): steps(N) = ceil(S / (N·B)). comm(N) is one ring all-reduce per step, "
            "2(N-1)·latency + 2(N-1)/N · bytes / bandwidth (reduce-scatter plus all-gather: "
            "2(N-1) messages of bytes/N), with bytes = the mode's measured comm bytes per step "
            "and the bandwidth per node. compute_per_sample is fitted to the measured epoch "
            "times (least squares of the relative error). Not modelled: overlap of "
            "communication with backward, stragglers, input stalls, and block momentum's "
            "once-per-block (not per-step) latency. The error column is (projected - measured) "
            "/ measured at each measured worker count."
        ),
    ]
    for curve in report.curves:
        if curve.projection is not None:
            blocks += _projection_blocks(curve, curve.projection)
    for device in report.devices:
        if device in figures:
            blocks.append(_Image(figures[device][1], f"PROJECTED epoch time on {device}"))
    if report.notes:
        blocks += [_Heading(2, "Notes"), _Bullets(report.notes)]
    return blocks


def _run_row(curve: ScalingCurve, row: ScalingRow) -> tuple[str, ...]:
    run = row.run
    if run.oversubscribed is None:
        oversubscribed = "unknown"
    else:
        oversubscribed = f"{'YES' if run.oversubscribed else 'no'} ({run.oversubscribed_source})"
    return (
        run.device,
        curve.label,
        str(run.workers),
        str(run.nodes),
        _fmt_s(run.epoch_time_s),
        _fmt_epochs(run.epochs_used, len(run.epochs)),
        _fmt_s(run.step_time_s),
        f"{row.speedup:.2f} (ideal {row.ideal_speedup:g})",
        f"{row.efficiency:.0%}",
        _fmt_s(run.load_time_s),
        f"{run.samples_per_s:.1f}" if run.samples_per_s is not None else "-",
        _fmt_bytes(run.comm_bytes_per_step),
        oversubscribed,
        run.label,
    )


def _fit_row(curve: ScalingCurve) -> tuple[str, ...]:
    counts = ", ".join(str(n) for n in sorted({r.run.workers for r in curve.fit_rows}))
    if curve.fit is None:
        return (curve.key.device, curve.label, str(len(curve.fit_rows)), counts, "n/a", "n/a")
    return (
        curve.key.device,
        curve.label,
        str(curve.fit.points),
        counts,
        f"{curve.fit.exponent:.3f}",
        f"{curve.fit.r_squared:.3f}",
    )


def _projection_blocks(curve: ScalingCurve, projection: CurveProjection) -> list[_Block]:
    model = projection.model
    worst = projection.max_abs_error
    summary = (
        f"Network {describe_network(model.network)} [{projection.network_source}]; "
        f"compute per sample {model.compute_per_sample_s * 1e3:.4g} ms (fitted"
        f"{', clamped at 0' if projection.compute_fit.clamped else ''}); all-reduce payload "
        f"{_fmt_bytes(model.payload_bytes)} per step; S = {model.samples_per_epoch} samples per "
        f"epoch; B = {model.batch_size}. Largest error on the measured points: "
        + (f"{worst:.1%}." if worst is not None else "n/a.")
    )
    rows = tuple(
        (
            str(p.workers) + ("" if p.measured_epoch_time_s is not None else " (projected)"),
            str(p.steps),
            _fmt_s(p.compute_s),
            _fmt_s(p.comm_s),
            _fmt_s(p.epoch_time_s),
            f"{p.speedup:.2f}",
            f"{p.efficiency:.0%}",
            _fmt_s(p.measured_epoch_time_s) if p.measured_epoch_time_s is not None else "-",
            f"{err:+.1%}" if (err := p.relative_error) is not None else "-",
        )
        for p in projection.points
    )
    return [
        _Heading(3, f"PROJECTED: {curve.key.device} · {curve.label}"),
        _Paragraph(summary),
        _Table(
            _PROJECTION_HEADERS,
            rows,
        ),
    ]


def _fmt_s(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    if seconds >= 100:
        return f"{seconds:.0f}"
    if seconds >= 1:
        return f"{seconds:.2f}"
    return f"{seconds:.3g}"


def _fmt_bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"


def _fmt_epochs(used: Sequence[int], total: int) -> str:
    if len(used) == total:
        return f"{total} of {total}"
    return f"{len(used)} of {total} (first left out)"


def render_markdown(blocks: Sequence[_Block]) -> str:
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, _Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, _Paragraph):
            parts.append(block.text)
        elif isinstance(block, _Table):
            lines = [_md_row(block.headers), "|" + "---|" * len(block.headers)]
            lines += [_md_row(row) for row in block.rows]
            parts.append("\n".join(lines))
        elif isinstance(block, _Image):
            parts.append(f"![{block.alt}]({block.filename})")
        else:
            parts.append("\n".join(f"- {item}" for item in block.items))
    return "\n\n".join(parts) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


_HTML_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0;font-size:90%}"
    "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}"
    "th{background:#eee}td:first-child,td:nth-child(2){text-align:left}"
    "img{max-width:100%}"
)


def _render_html(blocks: Sequence[_Block], images: Mapping[str, bytes]) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Scaling report</title>',
        f"<style>{_HTML_STYLE}</style></head><body>",
    ]
    for block in blocks:
        if isinstance(block, _Heading):
            parts.append(f"<h{block.level}>{esc(block.text)}</h{block.level}>")
        elif isinstance(block, _Paragraph):
            parts.append(f"<p>{esc(block.text)}</p>")
        elif isinstance(block, _Table):
            head = "".join(f"<th>{esc(h)}</th>" for h in block.headers)
            body = "".join(
                "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in block.rows
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, _Image):
            data = base64.b64encode(images[block.filename]).decode("ascii")
            parts.append(f'<p><img alt="{esc(block.alt)}" src="data:image/png;base64,{data}"></p>')
        else:
            parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in block.items) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib's object API on the Agg canvas: no pyplot state, no display needed)


def _plot_scaling(curves: Sequence[ScalingCurve], device: str) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 9), layout="constrained")
    ax_time, ax_speedup, ax_efficiency, ax_load = fig.subplots(2, 2).flat
    all_workers: set[int] = set()
    for i, curve in enumerate(curves):
        color = f"C{i % 10}"
        workers, epoch_s = _medians(curve.rows, lambda r: r.run.epoch_time_s)
        all_workers.update(workers)
        for row in curve.rows:
            hollow = row.run.oversubscribed is True
            ax_time.scatter(
                [row.run.workers],
                [row.run.epoch_time_s],
                facecolors="none" if hollow else color,
                edgecolors=color,
                zorder=3,
            )
        span = np.geomspace(min(workers), max(workers), 50) if len(workers) > 1 else None
        base_n = curve.baseline_workers
        base_s = epoch_s[workers.index(base_n)]
        if span is not None:
            ax_time.plot(
                span, base_s * base_n / span, ":", color=color, label=f"{curve.label}: ideal"
            )
        if curve.fit is not None and span is not None:
            fitted = [curve.fit.predict(n) for n in span]
            ax_time.plot(
                span,
                fitted,
                "--",
                color=color,
                label=f"{curve.label}: fit N^{curve.fit.exponent:.2f}",
            )
        ax_time.plot(
            workers, epoch_s, "-", color=color, alpha=0.4, label=f"{curve.label}: measured"
        )
        _, speedups = _medians(curve.rows, lambda r: r.speedup)
        ax_speedup.plot(workers, speedups, "o-", color=color, label=curve.label)
        ax_speedup.plot(workers, [n / base_n for n in workers], ":", color=color)
        _, efficiencies = _medians(curve.rows, lambda r: r.efficiency)
        ax_efficiency.plot(workers, efficiencies, "o-", color=color, label=curve.label)
        _, loads = _medians(curve.rows, lambda r: r.run.load_time_s)
        ax_load.plot(workers, loads, "s-", color=color, label=curve.label)
    ax_time.set(xscale="log", yscale="log", title="Epoch time (median, first epoch left out)")
    ax_time.set(ylabel="epoch time (s)")
    ax_speedup.set(title="Speed-up (dotted: ideal)", ylabel="speed-up")
    ax_efficiency.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax_efficiency.set(title="Parallel efficiency", ylabel="efficiency", ylim=(0, None))
    ax_load.set(
        title="One-time shard load (not in epoch time)", ylabel="load time (s)", ylim=(0, None)
    )
    for ax in (ax_time, ax_speedup, ax_efficiency, ax_load):
        _worker_axis(ax, all_workers)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Measured scaling: {device}\n(hollow markers: oversubscribed runs)")
    return _png(fig)


def _plot_projection(
    curves: Sequence[ScalingCurve], device: str, project_to: Sequence[int]
) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 7), layout="constrained")
    ax = fig.subplots()
    all_workers: set[int] = set(project_to)
    for i, curve in enumerate(curves):
        projection = curve.projection
        if projection is None:
            continue
        color = f"C{i % 10}"
        measured = [
            (p.workers, p.measured_epoch_time_s)
            for p in projection.points
            if p.measured_epoch_time_s is not None
        ]
        ax.scatter(
            [n for n, _ in measured],
            [t for _, t in measured],
            color=color,
            zorder=3,
            label=f"{curve.label}: measured",
        )
        top = max(p.workers for p in projection.points)
        low = min(p.workers for p in projection.points)
        span = sorted({round(n) for n in np.geomspace(low, top, 80)} | {low, top})
        ax.plot(
            span,
            [projection.model.epoch_time_s(n) for n in span],
            "--",
            color=color,
            label=f"{curve.label}: PROJECTED over {projection.model.network.name}",
        )
        targets = [p for p in projection.points if p.measured_epoch_time_s is None]
        ax.scatter(
            [p.workers for p in targets],
            [p.epoch_time_s for p in targets],
            facecolors="none",
            edgecolors=color,
            marker="D",
            zorder=3,
        )
        for p in targets:
            ax.annotate(
                f"{_fmt_s(p.epoch_time_s)} s",
                (p.workers, p.epoch_time_s),
                fontsize=8,
                textcoords="offset points",
                xytext=(4, 4),
            )
        all_workers.update(p.workers for p in projection.points)
    ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="epoch time (s)")
    ax.set_title(f"PROJECTED epoch time (ring all-reduce model): {device}")
    ax.text(
        0.5,
        0.5,
        "PROJECTED",
        transform=ax.transAxes,
        fontsize=60,
        color="0.9",
        ha="center",
        va="center",
        rotation=20,
        zorder=0,
    )
    _worker_axis(ax, all_workers)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


def _medians(rows: Sequence[ScalingRow], value: Any) -> tuple[list[int], list[float]]:
    by_workers: dict[int, list[float]] = {}
    for row in rows:
        by_workers.setdefault(row.run.workers, []).append(float(value(row)))
    workers = sorted(by_workers)
    return workers, [statistics.median(by_workers[n]) for n in workers]


def _worker_axis(ax: Any, workers: Iterable[int]) -> None:
    from matplotlib.ticker import FormatStrFormatter, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_xticks(sorted(workers))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("workers")
    if ax.get_yscale() == "log":  # plain seconds, not 6×10^1
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))


def _png(fig: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
