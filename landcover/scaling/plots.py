"""Figures of the scaling report, as PNG bytes: measured scaling per device (epoch time,
speed-up, efficiency, load time) and the PROJECTED epoch time of the ring model.

matplotlib's object API on the Agg canvas: no pyplot state, no display needed. Importing this
module costs about a second (matplotlib), so `landcover.scaling.report` imports it only to
write files. Device, curve and network names are plain text in the figures, never mathtext
(`landcover.markup`).
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter, ScalarFormatter
from numpy.typing import ArrayLike

from landcover.markup import plain_figures, plot_text
from landcover.scaling.curves import ScalingCurve, ScalingRow
from landcover.scaling.document import format_seconds


def scaling_png(curves: Sequence[ScalingCurve], device: str) -> bytes:
    """Four panels of one device's measured curves: epoch time (log-log, with the ideal line
    and the power-law fit), speed-up, parallel efficiency and the one-time shard load.
    Oversubscribed runs are drawn hollow; incomplete runs are crosses on the time panels,
    off the lines, and have no speed-up."""
    with plain_figures():
        return _scaling_png(curves, device)


def _scaling_png(curves: Sequence[ScalingCurve], device: str) -> bytes:
    fig = Figure(figsize=(12, 9), layout="constrained")
    ax_time, ax_speedup, ax_efficiency, ax_load = fig.subplots(2, 2).flat
    all_workers: set[int] = set()
    for i, curve in enumerate(curves):
        color = f"C{i % 10}"
        name = plot_text(curve.label)
        finished = curve.finished_rows
        workers, epoch_s = _medians(finished, lambda r: r.run.epoch_time_s)
        all_workers.update(r.run.workers for r in curve.rows)
        for row in finished:
            hollow = row.run.oversubscribed is True
            ax_time.scatter(
                [row.run.workers],
                [row.run.epoch_time_s],
                facecolors="none" if hollow else color,
                edgecolors=color,
                zorder=3,
            )
        base_n = curve.baseline_workers
        base_s = epoch_s[workers.index(base_n)]
        if len(workers) > 1:
            span = np.geomspace(min(workers), max(workers), 50)
            ax_time.plot(span, base_s * base_n / span, ":", color=color, label=f"{name}: ideal")
            if curve.fit is not None:
                fitted = [curve.fit.predict(n) for n in span]
                label = f"{name}: fit N^{curve.fit.exponent:.2f}"
                _model_line(ax_time, span, fitted, color, label)
        ax_time.plot(workers, epoch_s, "-", color=color, alpha=0.4, label=f"{name}: measured")
        _, speedups = _medians(finished, lambda r: r.speedup)
        ax_speedup.plot(workers, speedups, "o-", color=color, label=name)
        ax_speedup.plot(workers, [n / base_n for n in workers], ":", color=color)
        _, efficiencies = _medians(finished, lambda r: r.efficiency)
        ax_efficiency.plot(workers, efficiencies, "o-", color=color, label=name)
        _, loads = _medians(finished, lambda r: r.run.load_time_s)
        ax_load.plot(workers, loads, "s-", color=color, label=name)
        incomplete = [r for r in curve.incomplete_rows if r not in finished]
        if incomplete:
            crosses = {"marker": "x", "color": color, "zorder": 3}
            n = [r.run.workers for r in incomplete]
            ax_time.scatter(n, [r.run.epoch_time_s for r in incomplete], **crosses)
            ax_load.scatter(n, [r.run.load_time_s for r in incomplete], **crosses)
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
    fig.suptitle(
        f"Measured scaling: {plot_text(device)}\n(hollow markers: oversubscribed runs; "
        "crosses: incomplete runs, not fitted)"
    )
    return _png(fig)


def projection_png(curves: Sequence[ScalingCurve], device: str, project_to: Sequence[int]) -> bytes:
    """The ring model's PROJECTED epoch time of each curve of one device, over the measured
    points, out to the `project_to` worker counts (hollow diamonds, labelled)."""
    with plain_figures():
        return _projection_png(curves, device, project_to)


def _projection_png(
    curves: Sequence[ScalingCurve], device: str, project_to: Sequence[int]
) -> bytes:
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
            label=f"{plot_text(curve.label)}: measured",
        )
        low = min(p.workers for p in projection.points)
        top = max(p.workers for p in projection.points)
        span = sorted({round(n) for n in np.geomspace(low, top, 80)} | {low, top})
        projected = [projection.model.epoch_time_s(n) for n in span]
        label = (
            f"{plot_text(curve.label)}: PROJECTED over {plot_text(projection.model.network.name)}"
        )
        _model_line(ax, span, projected, color, label)
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
                f"{format_seconds(p.epoch_time_s)} s",
                (p.workers, p.epoch_time_s),
                fontsize=8,
                textcoords="offset points",
                xytext=(4, 4),
            )
        all_workers.update(p.workers for p in projection.points)
    ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="epoch time (s)")
    ax.set_title(f"PROJECTED epoch time (ring all-reduce model): {plot_text(device)}")
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


def _medians(
    rows: Sequence[ScalingRow], value: Callable[[ScalingRow], float]
) -> tuple[list[int], list[float]]:
    """Sorted worker counts and the median of `value` over the rows at each."""
    by_workers: dict[int, list[float]] = {}
    for row in rows:
        by_workers.setdefault(row.run.workers, []).append(value(row))
    workers = sorted(by_workers)
    return workers, [statistics.median(by_workers[n]) for n in workers]


def _model_line(
    ax: Axes, workers: ArrayLike, epoch_s: Sequence[float], color: str, label: str
) -> None:
    """A model's epoch times (a fit or a projection, not measurements) as a dashed line."""
    ax.plot(workers, epoch_s, "--", color=color, label=label)


def _worker_axis(ax: Axes, workers: Iterable[int]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(sorted(workers))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("workers")
    if ax.get_yscale() == "log":  # plain seconds, not 6×10^1
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
