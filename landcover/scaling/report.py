"""Scaling report: the curves of `landcover.scaling.curves` written as PNG plots, a Markdown
page and a self-contained HTML page (one document of `landcover.scaling.document` rendered
both ways).

`build_scaling_report` and the curve types are re-exported from `landcover.scaling.curves`, which
decides which runs are comparable and computes speed-up, fits and projections.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.vmsizes import Network
from landcover.comm.counts import CommCounts
from landcover.errors import ReportError
from landcover.outputs import (
    check_directory_output,
    finish_directory_output,
    output_directory,
    refuse_existing,
    write_bytes_atomic,
)
from landcover.scaling.advice import payoff_blocks
from landcover.scaling.curves import (
    DEFAULT_PROJECT_TO,
    CurveKey,
    CurveProjection,
    ScalingCurve,
    ScalingReport,
    ScalingRow,
    build_scaling_report,
    curve_key,
    scaling_table,
)
from landcover.scaling.document import (
    Block,
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    format_bytes,
    format_seconds,
    render_html,
    render_markdown,
)
from landcover.scaling.projection import describe_network
from landcover.scaling.runs import RunSummary

__all__ = [
    "DEFAULT_PROJECT_TO",
    "HTML_FILE",
    "MARKDOWN_FILE",
    "CurveKey",
    "CurveProjection",
    "ReportPaths",
    "ScalingCurve",
    "ScalingReport",
    "ScalingRow",
    "build_scaling_report",
    "curve_key",
    "report_markdown",
    "scaling_table",
    "write_report_files",
    "write_scaling_report",
]

logger = logging.getLogger(__name__)

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
TUTORIAL_EXPONENT = -0.80  # the exponent of the original Batch AI tutorial's scaling figure


@dataclass(frozen=True, slots=True)
class ReportPaths:
    """Where write_report_files put the report: the pages and the PNGs in `out_dir`."""

    out_dir: Path
    images: tuple[Path, ...]

    @property
    def markdown(self) -> Path:
        return self.out_dir / MARKDOWN_FILE

    @property
    def html(self) -> Path:
        return self.out_dir / HTML_FILE


_RUN_HEADERS = (
    *("device", "mode", "workers", "nodes", "threads/worker", "cores"),
    *("epoch time (s)", "epochs run", "epochs used"),
    *("step time (s)", "samples/s", "speed-up", "efficiency", "load time (s)", "comm/step"),
    *("oversubscribed", "run"),
)
_PROJECTION_HEADERS = (
    *("workers", "steps/epoch", "compute (s)", "comm (s)", "PROJECTED epoch time (s)"),
    *("speed-up", "efficiency", "measured (s)", "error"),
)
_PROJECTION_NOTE = (
    "Model: epoch_time(N) = steps(N) · (B · compute_per_sample + (1 - overlap) · comm(N)) with "
    "a fixed per-worker batch B and the epoch's S samples split over N workers (strong scaling "
    "of the epoch): steps(N) = floor(floor(S / N) / B), full batches of the smallest shard as "
    "the trainer runs them. comm(N) charges every collective the mode issued per step, as the "
    "comm layer counted them at run time (calls k and payload bytes b per kind), each by its "
    "ring algorithm over a per-node link of bandwidth β and latency α: all-reduce "
    "k·2(N-1)·α + 2(N-1)/N·b/β; all-gather (onebit) k·(N-1)·α + (N-1)·b/β, so onebit's bytes "
    "on the wire grow with N and exceed an fp32 all-reduce's above ~64 workers; broadcast "
    "k·(N-1)·α + b/β. PowerSGD issues three all-reduces per bucket (the uncompressed tensors, "
    "P, Q), block momentum one model all-reduce per block; DDP broadcasts no buffers and the "
    "once-per-epoch BatchNorm average is not charged. compute_per_sample is fitted to the "
    "measured epoch times (least squares of the relative error). ASSUMED, not measured: the "
    "overlap of communication with backward (0: communication charged in full, pessimistic "
    "where buckets overlap backward); not modelled: stragglers, input stalls, faster links "
    "inside a node. Speed-up and efficiency compare samples trained per second. A worker count "
    "at which a worker's shard holds fewer chips than a batch is not projected (the trainer "
    "would not run it). The error column is (projected - measured) / measured at each measured "
    "worker count."
)
_CURVE_NOTE = (
    "Runs share a curve only when they differ in the worker count alone: same device, chip "
    "store and chip size, model, per-worker batch, per-worker resources (threads per worker, "
    "mixed precision, VM size) and communication mode. Epoch time is the median of a "
    "run's per-epoch training times over every epoch but the first (warm-up) when the run has "
    "two or more epochs; it excludes validation and the one-time shard load, which has its own "
    "column. Speed-up and efficiency compare samples per second (an epoch trains full batches "
    "only, so epochs at different worker counts can train different sample counts) with the "
    "smallest worker count among the curve's finished runs. A run marked incomplete recorded "
    "fewer epochs than it planned without stopping early: it is shown but never fitted. The "
    "per-worker batch is fixed and the dataset is split across workers, so the epoch scales "
    "strongly while step time (epoch time / steps) is the weak-scaling view: ideally flat, "
    "its growth with workers is communication and contention."
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
    """Write `report` to `out_dir` (see write_scaling_report); refuses to replace an
    existing report unless `overwrite`."""
    out = output_directory(out_dir, fix="choose another --out", error=ReportError)
    pages = (out / MARKDOWN_FILE, out / HTML_FILE)
    refuse_existing(pages, overwrite=overwrite, what="the scaling report")
    old = check_directory_output(
        out, overwrite=overwrite, what="scaling report", owned=_is_report_file
    )
    # matplotlib takes about a second to import: only writing the figures pays for it
    from landcover.scaling.plots import projection_png, scaling_png

    figures = _figure_names(report.devices)
    images: dict[str, bytes] = {}
    for device, (scaling_name, projection_name) in figures.items():
        curves = report.curves_of(device)
        images[scaling_name] = scaling_png(curves, device)
        images[projection_name] = projection_png(curves, device, report.project_to)
    new = [*images, MARKDOWN_FILE, HTML_FILE]
    # pages first out, last in: a report.md/report.html on disk means its images are complete
    for stale in [*pages, *out.glob("scaling-*.png"), *out.glob("projection-*.png")]:
        if stale.name not in images:
            stale.unlink(missing_ok=True)
    for name, data in images.items():
        write_bytes_atomic(out / name, data)
    blocks = _document(report, figures)
    # without --overwrite, a page that appeared since the check above is kept, not replaced
    write_bytes_atomic(out / MARKDOWN_FILE, render_markdown(blocks).encode(), overwrite=overwrite)
    write_bytes_atomic(out / HTML_FILE, render_html(blocks, images).encode(), overwrite=overwrite)
    finish_directory_output(out, old, new)
    logger.info("wrote the scaling report to %s", out)
    return ReportPaths(out_dir=out, images=tuple(out / name for name in images))


def report_markdown(report: ScalingReport) -> str:
    """The report as Markdown text without image links, for printing."""
    return render_markdown(_document(report, figures={}))


def _is_report_file(name: str) -> bool:
    """Whether `name` is a file of a scaling report (its pages and figures)."""
    return name in (MARKDOWN_FILE, HTML_FILE) or bool(
        re.fullmatch(r"(scaling|projection)-.*\.png", name)
    )


def _figure_names(devices: Sequence[str]) -> dict[str, tuple[str, str]]:
    """device → (scaling PNG, projection PNG) file names, from a slug unique per device."""
    slugs: dict[str, str] = {}
    for device in devices:
        slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:60] or "device"
        candidate, i = slug, 2
        while candidate in slugs.values():
            candidate, i = f"{slug}-{i}", i + 1
        slugs[device] = candidate
    return {d: (f"scaling-{s}.png", f"projection-{s}.png") for d, s in slugs.items()}


def _document(report: ScalingReport, figures: Mapping[str, tuple[str, str]]) -> list[Block]:
    runs = [row.run for curve in report.curves for row in curve.rows]
    blocks: list[Block] = [
        Heading(1, "Scaling report"),
        Paragraph(
            f"{len(runs)} runs on {len(report.devices)} device(s): "
            + "; ".join(report.devices)
            + ". Each device has its own curves and figures; devices are never mixed."
        ),
        Heading(2, "Measured runs"),
        Table(
            _RUN_HEADERS,
            tuple(_run_row(curve, row) for curve in report.curves for row in curve.rows),
        ),
        Paragraph(_CURVE_NOTE),
        Heading(2, "Power-law fits"),
        Table(
            ("device", "curve", "runs fitted", "worker counts", "exponent b (t ∝ N^b)", "R²"),
            tuple(_fit_row(curve) for curve in report.curves),
        ),
        Paragraph(
            "Least squares of log(epoch time) = a + b·log(workers). Ideal strong scaling is "
            f"b = -1; the original tutorial's figure reported b = {TUTORIAL_EXPONENT:.2f}. "
            "Oversubscribed runs (more worker threads than cores on a host) are shown hollow "
            "and incomplete runs as crosses; both are left out of fits and projections."
        ),
    ]
    for device in report.devices:
        if device in figures:
            blocks.append(Image(figures[device][0], f"Measured scaling on {device}"))
    blocks += [
        Heading(2, "PROJECTED epoch times (ring model, not measurements)"),
        Paragraph(_PROJECTION_NOTE),
    ]
    for curve in report.curves:
        if curve.projection is not None:
            blocks += _projection_blocks(curve, curve.projection)
    for device in report.devices:
        if device in figures:
            blocks.append(Image(figures[device][1], f"PROJECTED epoch time on {device}"))
    blocks += payoff_blocks(report)
    if report.notes:
        blocks += [Heading(2, "Notes"), Bullets(report.notes)]
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
        "?" if run.threads_per_worker is None else str(run.threads_per_worker),
        "?" if run.cores is None else str(run.cores),
        format_seconds(run.epoch_time_s),
        run.progress,
        _format_epochs(run.epochs_used, len(run.epochs)),
        format_seconds(run.step_time_s),
        f"{run.samples_per_s:.1f}",
        # an unfinished run's few epochs are not a measurement to compare
        "-" if run.complete is False else f"{row.speedup:.2f} (ideal {row.ideal_speedup:g})",
        "-" if run.complete is False else f"{row.efficiency:.0%}",
        format_seconds(run.load_time_s),
        format_bytes(run.comm_bytes_per_step),
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


def _projection_blocks(curve: ScalingCurve, projection: CurveProjection) -> list[Block]:
    model = projection.model
    worst = projection.max_abs_error
    summary = (
        f"Network {describe_network(model.network)} [{projection.network_source}]; "
        f"compute per sample {model.compute_per_sample_s * 1e3:.4g} ms (fitted"
        f"{', clamped at 0' if projection.compute_fit.clamped else ''}); collectives per step: "
        f"{describe_counts(model.collectives)}; overlap assumed {model.overlap_fraction:.0%}; "
        f"S = {model.samples_per_epoch} samples per epoch; B = {model.batch_size}. Largest "
        "error on the measured points: "
        + (f"{worst:.1%}." if worst is not None else "n/a.")
        + (
            f" {projection.refused[0].upper()}{projection.refused[1:]}."
            if projection.refused
            else ""
        )
    )
    rows = tuple(
        (
            str(p.workers) + ("" if p.measured_epoch_time_s is not None else " (projected)"),
            str(p.steps),
            format_seconds(p.compute_s),
            format_seconds(p.comm_s),
            format_seconds(p.epoch_time_s),
            f"{p.speedup:.2f}",
            f"{p.efficiency:.0%}",
            format_seconds(p.measured_epoch_time_s) if p.measured_epoch_time_s is not None else "-",
            f"{err:+.1%}" if (err := p.relative_error) is not None else "-",
        )
        for p in projection.points
    )
    return [
        Heading(3, f"PROJECTED: {curve.key.device} · {curve.label}"),
        Paragraph(summary),
        Table(_PROJECTION_HEADERS, rows),
    ]


def _format_epochs(used: Sequence[int], total: int) -> str:
    if len(used) == total:
        return f"{total} of {total}"
    return f"{len(used)} of {total} (first left out)"


def describe_counts(counts: CommCounts) -> str:
    """`4 all-reduces of 1.00 MiB in all, 4 buckets` (nothing sent: `none`)."""
    parts = [
        f"{calls:.3g} {name}{'s' if calls != 1 else ''} of {format_bytes(sent)} in all"
        for name, calls, sent in (
            ("all-reduce", counts.allreduce_per_step, counts.allreduce_bytes_per_step),
            ("all-gather", counts.allgather_per_step, counts.allgather_bytes_per_step),
            ("broadcast", counts.broadcast_per_step, counts.broadcast_bytes_per_step),
        )
        if calls > 0 or sent > 0
    ]
    if counts.buckets_per_step:
        parts.append(f"{counts.buckets_per_step:.3g} buckets")
    if not counts.measured and parts:
        parts.append("inferred from the bytes: not recorded by kind")
    return ", ".join(parts) or "none"
