"""Scaling on emulated links: 2 nodes x 1 worker per communication mode, measured, and the
projection's error against each measurement.

For `small_unet` and `unet_resnet18`, every mode (none, fp16, bf16, powersgd:2, onebit, and
bmuf: block momentum, blocks of 4 steps) trains the same synthetic store on the local engine
as 2 simulated nodes of 1 worker each (`landcover cluster launch`, one thread per worker), each
node in its own network namespace (`cluster.local.netns`) behind a link of: unlimited (namespaces,
no shaping), 1 Gbit/s and 100 Mbit/s (tbf on both ends of each veth). From each run's
metrics.jsonl (`landcover.scaling.runs.load_runs`: medians over epochs 2..E):

- epoch s, comm ms/step (time with communication in flight), bytes/step (payload per rank);
- efficiency: samples/s on this link / samples/s of the same mode on the unlimited link;
- vs none: epoch time / epoch time of `none` on the same link;
- val mIoU of the last epoch;
- projected s and error: the projection (`landcover.scaling.projection.RingModel`, each mode
  charged for the collectives its runs recorded) fitted ONLY on the same mode's unlimited-link
  run, over a network given by --unlimited-network, then told this link's rate (the same
  latency: tbf adds no delay); error = (projected - measured) / measured.

Goals (issue 14), checked at the end: the projection within ±15 % on every point; on 100 Mbit/s,
unet_resnet18 with powersgd, onebit or bmuf trains an epoch in <= 0.6x the time of `none`, with
a last-epoch val mIoU within 0.03 of `none`. A miss is printed with its margin, never asserted.

Needs root (network namespaces, tc) and an otherwise idle machine: every point is two
processes with one thread each, timed one after another.

Usage: sudo python benchmarks/bench_scaling.py [--models small_unet,unet_resnet18]
           [--modes none,fp16,bf16,powersgd,onebit,bmuf] [--links unlimited,1gbit,100mbit]
           [--epochs N] [--scenes N] [--unlimited-network 6gbit:100us]
Smoke test (one tiny combination): --models small_unet --modes none --links 100mbit
--epochs 1 --scenes 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_comm import BATCH, MODES, build_store

from cluster.vmsizes import Network
from landcover.scaling.document import format_bytes
from landcover.scaling.projection import (
    MeasuredPoint,
    RingModel,
    fit_compute_per_sample,
    parse_network,
)
from landcover.scaling.runs import RunSummary, load_runs
from landcover.training.distributed import cpu_model_name
from tiling.runtime.machine import local_cpu_count

MODELS = ("small_unet", "unet_resnet18")
LINKS: dict[str, str | None] = {"unlimited": None, "1gbit": "1gbit", "100mbit": "100mbit"}
LINK_BITS_PER_S = {"1gbit": 1e9, "100mbit": 1e8}
ALIASES = {"powersgd": "powersgd:2"}
GOAL_ERROR = 0.15
GOAL_RATIO = 0.6
GOAL_MIOU = 0.03
GOAL_MODES = ("powersgd:2", "onebit", "bmuf")


@dataclass(frozen=True)
class Point:
    """One measured run: a model, a mode and a link."""

    model: str
    mode: str
    link: str
    run: RunSummary | None
    last_miou: float | None
    wall_s: float
    error: str | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument(
        "--modes",
        default="none,fp16,bf16,powersgd,onebit,bmuf",
        help=f"comma-separated, of {', '.join(MODES)} (powersgd = powersgd:2)",
    )
    parser.add_argument("--links", default=",".join(LINKS), help=f"of {', '.join(LINKS)}")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run (default 4)")
    parser.add_argument("--scenes", type=int, default=4, help="synthetic 448 px scenes")
    parser.add_argument(
        "--unlimited-network",
        default="6gbit:100us",
        help="the network the projection assumes for the unlimited link (gloo between two "
        "namespaces measured ~6 Gbit/s at 50 MiB; see /work/shared/notes/local-cluster.md)",
    )
    args = parser.parse_args()
    models = _split(args.models)
    modes = [ALIASES.get(m, m) for m in _split(args.modes)]
    links = _split(args.links)
    bad = [m for m in modes if m not in MODES] + [x for x in links if x not in LINKS]
    if bad:
        parser.error(
            f"unknown mode or link {bad[0]!r}; modes: {', '.join(MODES)}; links: {', '.join(LINKS)}"
        )
    if os.geteuid() != 0:
        sys.exit("bench_scaling needs root: each node runs in its own network namespace")
    unlimited_net = parse_network(args.unlimited_network)
    started = time.perf_counter()
    print(
        f"# bench_scaling — {cpu_model_name()}, {local_cpu_count()} cores; 2 nodes x 1 worker x "
        f"1 thread (gloo, network namespaces); {args.epochs} epochs; projection fitted on the "
        f"unlimited link as {unlimited_net.name}"
    )
    print(f"load average before: {_load()}")
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        work = Path(tmp)
        store, train_chips, val_chips = build_store(work, scenes=args.scenes)
        print(
            f"store: {args.scenes} synthetic scenes, {train_chips} train / {val_chips} val "
            f"chips; batch {BATCH} per worker, seed 0"
        )
        print()
        points: list[Point] = []
        for model in models:
            for mode in modes:
                # unlimited first: the projection of the other links is fitted on it
                for link in sorted(links, key=lambda x: x != "unlimited"):
                    points.append(run_point(store, work, model, mode, link, epochs=args.epochs))
            print_table(model, [p for p in points if p.model == model], unlimited_net)
        print_goals(points, unlimited_net)
    print(f"load average after: {_load()}; total {time.perf_counter() - started:.0f} s")


def run_point(store: str, work: Path, model: str, mode: str, link: str, *, epochs: int) -> Point:
    name = f"{model}-{mode.replace(':', '-')}-{link}"
    spec = {
        "name": "bench-scaling",
        "engine": "local",
        "targetNodeCount": 2,
        "processesPerNode": 1,
        "network": {} if LINKS[link] is None else {"bandwidth": LINKS[link]},
    }
    cluster_json = work / f"{name}.cluster.json"
    cluster_json.write_text(json.dumps(spec))
    run_dir = work / name
    command = [
        sys.executable, "-m", "landcover.cli.app", "-q", "cluster", "launch", str(cluster_json),
        "--", "train", store, "--out", str(run_dir), "--threads", "1", "--device", "cpu",
        "--model", model, "--epochs", str(epochs), "--batch-size", str(BATCH), "--seed", "0",
        *MODES[mode],
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    metrics = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    if done.returncode != 0 or len(lines) != epochs:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        error = f"exit {done.returncode}: " + " | ".join(tail)
        print(f"  {name}: FAILED {error}", file=sys.stderr)
        return Point(model, mode, link, None, None, wall_s, error)
    print(f"  {name}: {wall_s:.0f} s", file=sys.stderr)
    (run,) = load_runs([run_dir])
    return Point(model, mode, link, run, lines[-1].get("val_miou"), wall_s)


def projected_epoch_s(unlimited: RunSummary, run: RunSummary, link: str, net: Network) -> float:
    """The epoch time of `run` projected from `unlimited` alone (same model and mode)."""
    counts = unlimited.comm_counts
    measured = MeasuredPoint(
        unlimited.workers, unlimited.steps, unlimited.batch_size, unlimited.epoch_time_s
    )
    fit = fit_compute_per_sample(
        [measured], payload_bytes=counts.bytes_per_step, network=net, counts=counts
    )
    model = RingModel(
        fit.compute_per_sample_s,
        counts.bytes_per_step,
        unlimited.samples_per_epoch,
        unlimited.batch_size,
        net,
        counts=counts,
    )
    bits = LINK_BITS_PER_S.get(link)
    if bits is not None:
        model = model.with_network(Network(link, bits / 8, net.latency_s))
    return float(run.steps * model.step_time_s(run.workers))


@dataclass(frozen=True)
class Row:
    point: Point
    run: RunSummary
    efficiency: float | None  # samples/s vs the same mode unlimited
    vs_none: float | None  # epoch time / none's on the same link
    projected_s: float | None
    error: float | None


def rows_of(points: list[Point], net: Network) -> list[Row]:
    done = {(p.model, p.mode, p.link): p.run for p in points if p.run is not None}
    rows = []
    for p in points:
        if p.run is None:
            continue
        base = done.get((p.model, p.mode, "unlimited"))
        none = done.get((p.model, "none", p.link))
        projected = error = efficiency = None
        if base is not None:
            efficiency = p.run.samples_per_s / base.samples_per_s
            projected = projected_epoch_s(base, p.run, p.link, net)
            error = (projected - p.run.epoch_time_s) / p.run.epoch_time_s
        vs_none = p.run.epoch_time_s / none.epoch_time_s if none is not None else None
        rows.append(Row(p, p.run, efficiency, vs_none, projected, error))
    return rows


def print_table(model: str, points: list[Point], net: Network) -> None:
    print(f"## {model}: 2 nodes x 1 worker; medians of epochs 2..E")
    print()
    print(
        "| mode | link | epoch s | comm ms/step | bytes/step | efficiency vs unlimited "
        "| vs none | val mIoU (last) | projected s | projection error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in points:
        if p.error is not None:
            print(f"| {p.mode} | {p.link} | failed: {p.error} ||||||||")
    for r in rows_of(points, net):
        miou = "-" if r.point.last_miou is None else f"{r.point.last_miou:.3f}"
        print(
            f"| {r.point.mode} | {r.point.link} | {r.run.epoch_time_s:.2f} "
            f"| {_comm_ms(r.run)} | {format_bytes(r.run.comm_bytes_per_step)} "
            f"| {_pct(r.efficiency)} | {_ratio(r.vs_none)} | {miou} "
            f"| {'-' if r.projected_s is None else f'{r.projected_s:.2f}'} "
            f"| {'-' if r.error is None else f'{r.error:+.1%}'} |"
        )
    print()


def print_goals(points: list[Point], net: Network) -> None:
    rows = rows_of(points, net)
    print("## Goals")
    print()
    if not any(r.error is not None for r in rows):
        print(
            "- projection error: no point has its mode's unlimited-link run (add --links unlimited)"
        )
    errors = [r for r in rows if r.error is not None]
    worst = max(errors, key=lambda r: abs(r.error or 0.0), default=None)
    if worst is not None and worst.error is not None:
        verdict = "met" if abs(worst.error) <= GOAL_ERROR else "MISSED"
        where = f"{worst.point.model} {worst.point.mode} {worst.point.link}"
        print(
            f"- projection within ±{GOAL_ERROR:.0%} on every point: {verdict} "
            f"(worst {worst.error:+.1%}: {where})"
        )
    by_key = {(r.point.model, r.point.mode, r.point.link): r for r in rows}
    none = by_key.get(("unet_resnet18", "none", "100mbit"))
    for mode in GOAL_MODES:
        row = by_key.get(("unet_resnet18", mode, "100mbit"))
        if row is None or none is None or row.vs_none is None:
            continue
        fast = row.vs_none <= GOAL_RATIO
        miou_gap = None
        if row.point.last_miou is not None and none.point.last_miou is not None:
            miou_gap = row.point.last_miou - none.point.last_miou
        close = miou_gap is not None and abs(miou_gap) <= GOAL_MIOU
        gap = "n/a" if miou_gap is None else f"{miou_gap:+.3f}"
        print(
            f"- unet_resnet18 {mode} on 100 Mbit/s: epoch {row.vs_none:.2f}x none "
            f"({'met' if fast else 'MISSED'} <= {GOAL_RATIO}), val mIoU {gap} vs none "
            f"({'met' if close else 'MISSED'} within {GOAL_MIOU})"
        )
    print()


def _comm_ms(run: RunSummary) -> str:
    return "-" if run.comm_time_s is None else f"{run.comm_time_s * 1e3:.1f}"


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg()) + " (1, 5, 15 min)"


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_scaling.py"):
        main()
