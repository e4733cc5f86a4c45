"""Scaling curves: which training runs are comparable, their speed-up and efficiency, a
power-law fit of epoch time and a ring-model projection to large clusters.

Runs (`landcover.scaling.runs.load_runs`) join one curve only when they are points of one experiment
that differ in the worker count alone: the same device, chip store (URL and content digest),
chip size, model, per-worker batch, per-worker resources (threads per worker, mixed precision,
VM size) and communication mode (compression, block momentum). Anything else is its own curve,
with a note naming what differs; one curve never mixes devices, and figures are drawn per
device.

Speed-up and efficiency compare samples per second, not epoch times: an epoch trains only full
batches of each worker's shard, so a 1-worker and an 8-worker epoch can train different sample
counts. They are against the smallest worker count of the curve among its finished runs.
Incomplete runs (killed or still running: fewer epochs than planned and no early stop) stay in
the tables, marked, but never in a fit or projection; neither are oversubscribed runs, unless
that would leave fewer than two worker counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from cluster.vmsizes import Network, network_for
from landcover.errors import ReportError
from landcover.scaling.projection import (
    DEFAULT_NETWORK,
    ComputeFit,
    MeasuredPoint,
    PowerLawFit,
    ProjectedPoint,
    RingModel,
    fit_compute_per_sample,
    fit_power_law,
    project,
    refusal_reason,
)
from landcover.scaling.runs import RunSummary, median_counts

DEFAULT_PROJECT_TO = (8, 16, 64, 148)

__all__ = [
    "DEFAULT_PROJECT_TO",
    "CurveKey",
    "CurveProjection",
    "ScalingCurve",
    "ScalingReport",
    "ScalingRow",
    "build_scaling_report",
    "curve_key",
    "scaling_table",
    "speedup_by_workers",
]


@dataclass(frozen=True, slots=True)
class CurveKey:
    """What makes runs comparable points of one curve."""

    device: str
    store: str | None
    compression: str
    block_momentum: bool
    model: str | None
    batch_size: int
    threads_per_worker: int | None = None
    chip_size_px: int | None = None
    amp: bool | None = None
    vm_size: str | None = None
    store_digest: str | None = None

    @property
    def mode(self) -> str:
        return self.compression + (" + block momentum" if self.block_momentum else "")

    def experiment(self) -> CurveKey:
        """This key without its communication mode: what a mode's curve and its plain `none`
        curve must share to be compared."""
        return replace(self, compression="none", block_momentum=False)


@dataclass(frozen=True, slots=True)
class ScalingRow:
    """One run in its curve: speed-up (samples per second) against the curve's baseline."""

    run: RunSummary
    speedup: float
    ideal_speedup: float

    @property
    def efficiency(self) -> float:
        return self.speedup / self.ideal_speedup


@dataclass(frozen=True, slots=True)
class CurveProjection:
    """The ring-model projection of one curve (PROJECTED, not measured); `refused` says which
    worker counts were not projected and why (None: all were)."""

    model: RingModel
    network_source: str
    compute_fit: ComputeFit
    points: tuple[ProjectedPoint, ...]
    refused: str | None = None

    @property
    def max_abs_error(self) -> float | None:
        errors = [abs(e) for p in self.points if (e := p.relative_error) is not None]
        return max(errors) if errors else None


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    """The runs of one curve key, their power-law fit and their projection (None when there is
    nothing to fit)."""

    key: CurveKey
    label: str
    rows: tuple[ScalingRow, ...]
    baseline_workers: int
    fit_rows: tuple[ScalingRow, ...]  # the rows the power law and projection are fitted to
    fit: PowerLawFit | None
    projection: CurveProjection | None

    @property
    def finished_rows(self) -> tuple[ScalingRow, ...]:
        """The rows the curve's lines join: its finished runs (all rows when none finished)."""
        return _finished(self.rows)

    @property
    def incomplete_rows(self) -> tuple[ScalingRow, ...]:
        return tuple(r for r in self.rows if r.run.complete is False)


@dataclass(frozen=True, slots=True)
class ScalingReport:
    """Every curve, grouped by device in `devices` order, and notes on what was assumed."""

    curves: tuple[ScalingCurve, ...]
    devices: tuple[str, ...]
    project_to: tuple[int, ...]
    notes: tuple[str, ...]

    def curves_of(self, device: str) -> tuple[ScalingCurve, ...]:
        return tuple(c for c in self.curves if c.key.device == device)


def curve_key(run: RunSummary) -> CurveKey:
    return CurveKey(
        run.device,
        run.store,
        run.compression,
        run.block_momentum,
        run.model,
        run.batch_size,
        threads_per_worker=run.threads_per_worker,
        chip_size_px=run.chip_size_px,
        amp=run.amp,
        vm_size=run.vm_size,
        store_digest=run.store_digest,
    )


def scaling_table(runs: Sequence[RunSummary]) -> list[ScalingRow]:
    """Every run with its speed-up and efficiency against the baseline of its curve, sorted
    by device, store, mode, model, batch and workers."""
    return [row for members in _group(runs).values() for row in _rows_of(members)[0]]


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
    groups = _group(runs)
    notes: list[str] = _resource_notes(list(groups))
    curves: list[ScalingCurve] = []
    for key, members in groups.items():
        label = _label(key, [k for k in groups if k.device == key.device])
        where = f"{key.device}, {label}"
        rows, baseline_workers = _rows_of(members)
        fit_rows = _fit_rows(rows, where, notes)
        fit = None
        if len({r.run.workers for r in fit_rows}) >= 2:
            fit = fit_power_law(
                [r.run.workers for r in fit_rows], [r.run.epoch_time_s for r in fit_rows]
            )
        projection = None
        if fit_rows:
            projection = _project_curve(key, where, fit_rows, project_to, network, notes)
        curves.append(
            ScalingCurve(key, label, tuple(rows), baseline_workers, fit_rows, fit, projection)
        )
    devices = tuple(dict.fromkeys(c.key.device for c in curves))
    return ScalingReport(tuple(curves), devices, tuple(sorted(set(project_to))), tuple(notes))


def _group(runs: Sequence[RunSummary]) -> dict[CurveKey, list[RunSummary]]:
    groups: dict[CurveKey, list[RunSummary]] = {}
    for run in sorted(runs, key=lambda r: (*_sort_key(curve_key(r)), r.workers, r.label)):
        groups.setdefault(curve_key(run), []).append(run)
    return groups


def _sort_key(key: CurveKey) -> tuple[str, str, bool, str, str, int, int, int, str, str, str]:
    return (
        key.device,
        key.store or "",
        key.block_momentum,
        key.compression,
        key.model or "",
        key.batch_size,
        key.threads_per_worker or 0,
        key.chip_size_px or 0,
        str(key.amp),
        key.vm_size or "",
        key.store_digest or "",
    )


def _finished(rows: Sequence[ScalingRow]) -> tuple[ScalingRow, ...]:
    # complete is None (no planned epoch count recorded) counts as finished: nothing says not
    finished = tuple(r for r in rows if r.run.complete is not False)
    return finished or tuple(rows)


def speedup_by_workers(rates: Sequence[tuple[int, float]]) -> dict[int, float]:
    """The speed-up of each worker count in `rates` ((workers, samples per second) of runs):
    the median rate of its runs over the median rate at the smallest count. A speed-up
    belongs to a worker count, so repeated runs at one count share it, and a repeat that
    happened to be faster than the others never reads as over 100 % efficiency."""
    counts = {n for n, _ in rates}
    median_at = {n: statistics.median(rate for m, rate in rates if m == n) for n in counts}
    baseline = median_at[min(counts)]
    return {n: rate / baseline for n, rate in median_at.items()}


def _rows_of(members: Sequence[RunSummary]) -> tuple[list[ScalingRow], int]:
    """Rows of one curve and its baseline worker count: the smallest among finished runs.
    Finished runs take their worker count's speed-up (`speedup_by_workers`); an unfinished
    run keeps its own rate."""
    finished = [r for r in members if r.complete is not False] or list(members)
    baseline_workers = min(r.workers for r in finished)
    speedup_at = speedup_by_workers([(r.workers, r.samples_per_s) for r in finished])
    baseline = statistics.median(r.samples_per_s for r in finished if r.workers == baseline_workers)
    rows = [
        ScalingRow(
            r,
            speedup_at[r.workers] if r in finished else r.samples_per_s / baseline,
            r.workers / baseline_workers,
        )
        for r in members
    ]
    return rows, baseline_workers


def _fit_rows(rows: Sequence[ScalingRow], where: str, notes: list[str]) -> tuple[ScalingRow, ...]:
    incomplete = [r.run for r in rows if r.run.complete is False]
    if incomplete:
        listed = ", ".join(f"{run.label} (epoch {run.progress})" for run in incomplete)
        notes.append(
            f"{where}: incomplete runs, shown but left out of the fit and projection: {listed}."
        )
    finished = [r for r in rows if r.run.complete is not False]
    fit_rows = [r for r in finished if r.run.oversubscribed is not True]
    if len({r.run.workers for r in fit_rows}) < 2 and len(fit_rows) < len(finished):
        fit_rows = finished
        notes.append(
            f"{where}: fewer than two worker counts are not oversubscribed, so the fit and "
            "projection use the oversubscribed runs too."
        )
    if not fit_rows:
        notes.append(f"{where}: no finished run, so no fit and no projection.")
    return tuple(fit_rows)


def _label(key: CurveKey, siblings: Sequence[CurveKey]) -> str:
    """The mode, plus whatever else tells this curve from the others on the same device."""
    label = key.mode
    if len({k.model for k in siblings}) > 1:
        label = f"{key.model or '?'} · {label}"
    if len({k.batch_size for k in siblings}) > 1:
        label = f"{label} · batch {key.batch_size}"
    stores = {k.store for k in siblings}
    if len(stores) > 1:
        label = f"{label} · store {_store_name(key.store, stores)}"
    for field_name, _, show in _RESOURCES:
        if len({getattr(k, field_name) for k in siblings}) > 1:
            label = f"{label} · {show(getattr(key, field_name))}"
    return label


# Per-worker resources and store content that make runs different experiments: the field of
# CurveKey, how a note names it, and how a curve's label shows its value.
_RESOURCES: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("threads_per_worker", "threads per worker", lambda v: f"{v or '?'} threads/worker"),
    ("chip_size_px", "chip size", lambda v: f"chip {v or '?'} px"),
    ("amp", "mixed precision", lambda v: {True: "amp", False: "fp32"}.get(v, "amp ?")),
    ("vm_size", "VM size", lambda v: f"vmSize {v or '?'}"),
    ("store_digest", "store content (digest)", lambda v: f"store {str(v or '?')[:8]}"),
)


def _resource_notes(keys: Sequence[CurveKey]) -> list[str]:
    """One note per device on whose runs a per-worker resource differs: they are separate
    curves, never joined into one speed-up."""
    notes = []
    for device in dict.fromkeys(k.device for k in keys):
        siblings = [k for k in keys if k.device == device]
        for field_name, words, show in _RESOURCES:
            values = list(dict.fromkeys(getattr(k, field_name) for k in siblings))
            if len(values) > 1:
                shown = ", ".join(show(v) for v in values)
                notes.append(
                    f"{device}: the runs differ in {words} ({shown}), so they are separate "
                    "curves; a speed-up compares runs with the same per-worker resources only."
                )
    return notes


def _store_name(store: str | None, stores: set[str | None]) -> str:
    """The store's last path part, or its whole URL where two stores share that part."""
    if store is None:
        return "unknown"
    short = PurePosixPath(store.rstrip("/")).name or store
    clash = [s for s in stores if s is not None and PurePosixPath(s.rstrip("/")).name == short]
    return store if len(clash) > 1 else short


def _project_curve(
    key: CurveKey,
    where: str,
    fit_rows: Sequence[ScalingRow],
    project_to: Sequence[int],
    override: Network | None,
    notes: list[str],
) -> CurveProjection:
    runs = [r.run for r in fit_rows]
    network, source = _choose_network(runs, override, where, notes)
    # what a rank issues per step with peers: a single worker communicates nothing
    talking = [r for r in runs if r.workers > 1] or runs
    counts = median_counts([r.comm_counts for r in talking])
    payload = counts.bytes_per_step
    if payload > 0 and not counts.measured:
        notes.append(
            f"{where}: the runs did not record their collectives by kind (older metrics.jsonl); "
            "the projection assumes one "
            + ("all-gather" if counts.allgather_per_step else "all-reduce")
            + " of the measured bytes per step."
        )
    if payload == 0:
        notes.append(
            f"{where}: no run measured any bytes communicated per step, so the projection "
            "has no communication cost; measure a run with 2 or more workers."
        )
    points = [MeasuredPoint(r.workers, r.steps, r.batch_size, r.epoch_time_s) for r in runs]
    compute = fit_compute_per_sample(points, payload_bytes=payload, network=network, counts=counts)
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
        counts=counts,
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
    # the reason is stated beside the curve's projection table (report.py)
    refused = refusal_reason(model, [n for n in project_to if n not in measured])
    return CurveProjection(model, source, compute, points_out, refused)


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
