"""Scaling sweeps: the same training at several worker counts, one run dir each.

`run_sweep` trains at every worker count N into `DIR/workers-N` (the local engine on this
machine unless a cluster spec is given; a remote engine's job is awaited and its run dir
fetched, so the runs are measured one after another under the same conditions). Each run keeps
the trainer's own files (metrics.jsonl, run.json, ...). A rerun reuses the runs that finished
(unless `overwrite`) and redoes the others from scratch.

On the local engine, N workers are one node with N processes (or, with a cluster spec, N /
processesPerNode simulated nodes), each with max(1, cores // N) threads. More workers than
cores is allowed but marked `oversubscribed`: such a point measures time-slicing, not scaling.

Files written (atomically, after every run, so a partial sweep is readable):

`DIR/sweep.json`::

    {
      "format": "landcover-sweep", "version": 1,
      "engine": "local",                 engine of every run
      "cluster": "local",                cluster name (spec name)
      "vm_size": "local",
      "host": "myhost",                  machine that ran the sweep
      "cores": 2,                        cores usable on that machine
      "store": "chips.zarr",             redacted
      "epochs": 3,
      "train_args": ["--model", "small_unet"],   extra training args, redacted
      "entry_module": "landcover.training",
      "created": "2026-01-01T00:00:00+00:00", "updated": "...",
      "runs": [RUN, ...]                 in worker-count order
    }

RUN (also written alone as `DIR/workers-N/launch.json` once that run ended)::

    {
      "workers": 2, "nodes": 1, "processes_per_node": 2,
      "threads_per_worker": 1,           --threads the workers got
      "cores": 2,                        cores the run had (local: this machine's; remote:
                                         nodes x vCPUs of the VM size, or null if unknown)
      "oversubscribed": false,           workers > cores (local engine only)
      "run_dir": "workers-2",            relative to DIR
      "status": "done" | "failed" | "submitted",
      "error": null | "one line",
      "job_id": "...", "log_dir": "workers-2/logs" | URL | null,
      "wall_time_s": 31.2,               launch to exit, startup and load included
      "epochs_done": 3,                  lines in metrics.jsonl
      "epoch_time_s": 4.1,               median of metrics.jsonl epoch_time_s (null if none)
      "samples_per_s": 812.0             median of metrics.jsonl samples_per_s (null if none)
    }
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from cluster.engine import Job, LaunchOptions, job_redactor, launch_plan, plan_job
from cluster.errors import ClusterError, LaunchError
from cluster.machine import local_cpu_count
from cluster.redact import Redactor
from cluster.spec import ClusterSpec, ElasticSpec, local_spec
from landcover.training.config import TrainConfig, split_argv
from landcover.training.launch import WORKER_MODULE, training_job, worker_config

logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
RUN_FILE = "launch.json"
SWEEP_FORMAT = "landcover-sweep"
SWEEP_VERSION = 1
RUN_PREFIX = "workers-"
_RESERVED_ARGS = ("--out", "--epochs", "--nproc")

RunStatus = Literal["done", "failed", "submitted"]


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """One sweep: the store, the worker counts, epochs per run, where the runs go, and the
    other training options (`extra_args`, as after `landcover scale ... --`; storage options
    among them reach the workers through their environment)."""

    store: str
    workers: tuple[int, ...]
    epochs: int
    out_dir: str
    extra_args: tuple[str, ...] = field(default=(), repr=False)  # may hold an account key
    cluster: ClusterSpec | None = None
    entry_module: str = WORKER_MODULE
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class SweepRun:
    """One worker count's run, as recorded in sweep.json (see the module docstring)."""

    workers: int
    nodes: int
    processes_per_node: int
    threads_per_worker: int | None
    cores: int | None
    oversubscribed: bool
    run_dir: str
    status: RunStatus
    error: str | None
    job_id: str | None
    log_dir: str | None
    wall_time_s: float | None
    epochs_done: int
    epoch_time_s: float | None
    samples_per_s: float | None


@dataclass(frozen=True, slots=True)
class SweepResult:
    path: Path  # DIR/sweep.json
    cores: int
    runs: tuple[SweepRun, ...]

    @property
    def failed(self) -> tuple[SweepRun, ...]:
        return tuple(r for r in self.runs if r.status == "failed")


def parse_worker_counts(text: str) -> tuple[int, ...]:
    """ "1,2,4" -> (1, 2, 4): sorted, without repeats, each >= 1."""
    counts: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ClusterError(
                f"--workers {text!r}: {part!r} is not a whole number; give e.g. 1,2,4"
            ) from None
        if value < 1:
            raise ClusterError(f"--workers {text!r}: worker counts must be >= 1, got {value}")
        counts.add(value)
    if not counts:
        raise ClusterError("--workers is empty; give the worker counts, e.g. 1,2,4")
    return tuple(sorted(counts))


def spec_for_workers(base: ClusterSpec | None, workers: int) -> ClusterSpec:
    """The spec one sweep point runs on: N workers as nodes x processesPerNode."""
    if base is None:
        return local_spec(workers)
    per_node = base.processes_per_node
    if workers < per_node:
        nodes, per_node = 1, workers
    elif workers % per_node == 0:
        nodes = workers // per_node
    else:
        raise ClusterError(
            f"{workers} workers is not a multiple of processesPerNode ({per_node}) of cluster "
            f"{base.name!r}: use worker counts like {per_node}, {2 * per_node}, {4 * per_node}"
        )
    elastic = None
    if base.elastic is not None:  # each point is measured at a fixed size; restarts stay
        elastic = ElasticSpec(nodes, nodes, base.elastic.max_restarts)
    return replace(base, node_count=nodes, processes_per_node=per_node, elastic=elastic)


def check_extra_args(args: tuple[str, ...]) -> None:
    for arg in args:
        for reserved in _RESERVED_ARGS:
            if arg == reserved or arg.startswith(reserved + "="):
                raise ClusterError(
                    f"{reserved} is set by the sweep (--out DIR, --epochs, --workers); "
                    "remove it from the training arguments"
                )


def run_sweep(
    config: SweepConfig,
    options: LaunchOptions | None = None,
    *,
    on_run: Callable[[SweepRun], None] | None = None,
) -> SweepResult:
    """Train at each worker count; returns every run (failed ones included, never raised)."""
    training, stand_in_args = sweep_training(config)
    options = replace(options or LaunchOptions(), wait=True)
    out = Path(config.out_dir)
    redactor = job_redactor(
        config.cluster or local_spec(1),
        training_job(local_spec(1), training, extra_args=stand_in_args),
    )
    header = _header(config, redactor)
    sweep_path = out / SWEEP_FILE
    previous = _previous_runs(sweep_path, header, config.overwrite)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[SweepRun] = []
    for workers in config.workers:
        spec = spec_for_workers(config.cluster, workers)
        run_dir = out / f"{RUN_PREFIX}{workers}"
        reused = previous.get(workers)
        if reused is not None and (run_dir / "metrics.jsonl").exists():
            logger.info("reusing the finished run %s", run_dir)
            run = reused
        else:
            point = replace(training, out_dir=str(run_dir))
            job = training_job(
                spec, point, entry_module=config.entry_module, extra_args=stand_in_args
            )
            run = _run_one(spec, job, worker_config(spec, point), options, redactor)
            if run_dir.is_dir():
                _write_json(run_dir / RUN_FILE, asdict(run))
        runs.append(run)
        _write_json(sweep_path, {**header, "updated": _now(), "runs": [asdict(r) for r in runs]})
        if on_run is not None:
            on_run(run)
    return SweepResult(path=sweep_path, cores=local_cpu_count(), runs=tuple(runs))


def _header(config: SweepConfig, redactor: Redactor) -> dict[str, Any]:
    spec = config.cluster
    return {
        "format": SWEEP_FORMAT,
        "version": SWEEP_VERSION,
        "engine": spec.engine if spec else "local",
        "cluster": spec.name if spec else "local",
        "vm_size": spec.vm_size if spec else "local",
        "host": socket.gethostname(),
        "cores": local_cpu_count(),
        "store": redactor.text(config.store),
        "epochs": config.epochs,
        "train_args": redactor.args(config.extra_args),
        "entry_module": config.entry_module,
        "created": _now(),
    }


_SAME_SWEEP_KEYS = ("engine", "cluster", "vm_size", "store", "epochs", "train_args", "entry_module")


def _previous_runs(path: Path, header: Mapping[str, Any], overwrite: bool) -> dict[int, SweepRun]:
    """Finished runs of an earlier sweep of the same settings in the same DIR."""
    if overwrite or not path.exists():
        return {}
    try:
        old = json.loads(path.read_text())
        old_runs = [SweepRun(**r) for r in old.get("runs", [])]
    except (ValueError, TypeError) as exc:
        raise ClusterError(
            f"{path} is not a readable sweep ({exc.__class__.__name__}); pass --overwrite"
        ) from None
    changed = [k for k in _SAME_SWEEP_KEYS if old.get(k) != header.get(k)]
    if changed:
        raise ClusterError(
            f"{path.parent} holds a sweep with other settings ({', '.join(changed)} differ); "
            "pass --overwrite to replace it or choose another --out"
        )
    return {r.workers: r for r in old_runs if r.status == "done"}


def sweep_training(config: SweepConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """The training configuration of every run (its run dir aside: the first run's), parsed
    from the sweep's store, epochs and `extra_args` by the worker's own options, and the
    arguments of a stand-in entry module that the worker does not take."""
    check_extra_args(config.extra_args)
    given = {
        "out_dir": str(Path(config.out_dir) / f"{RUN_PREFIX}{config.workers[0]}"),
        "epochs": config.epochs,
    }
    strict = config.entry_module == WORKER_MODULE
    # STORE first, as the worker takes it: a stand-in's own option values stay its own
    return split_argv([config.store, *config.extra_args], strict=strict, given=given)


def _run_one(
    spec: ClusterSpec,
    job: Job,
    worker: TrainConfig,
    options: LaunchOptions,
    redactor: Redactor,
) -> SweepRun:
    run_dir = Path(worker.out_dir)
    if run_dir.exists():  # an unfinished or replaced run of ours: never trusted
        shutil.rmtree(run_dir)
    plan = plan_job(spec, job)
    local = spec.engine == "local"
    cores = local_cpu_count() if local else _remote_cores(spec)
    logger.info("sweep: %d worker(s) into %s", spec.workers, run_dir)
    started = time.monotonic()
    status: RunStatus
    try:
        result = launch_plan(plan, options)
        status = "done" if result.status == "succeeded" else "submitted"
        error, job_id, log_dir = None, result.job_id, result.log_location
    except LaunchError as exc:
        status, error, job_id = "failed", redactor.text(str(exc)), None
        log_dir = str(run_dir / "logs") if local else None
    wall_time_s = time.monotonic() - started
    epochs_done, epoch_time_s, samples_per_s = summarize_metrics(run_dir / "metrics.jsonl")
    if log_dir is not None and Path(log_dir).is_relative_to(run_dir.parent):
        log_dir = str(Path(log_dir).relative_to(run_dir.parent))
    return SweepRun(
        workers=spec.workers,
        nodes=spec.node_count,
        processes_per_node=spec.processes_per_node,
        threads_per_worker=worker.threads,
        cores=cores,
        oversubscribed=local and spec.workers > local_cpu_count(),
        run_dir=run_dir.name,
        status=status,
        error=error,
        job_id=job_id,
        log_dir=log_dir,
        wall_time_s=round(wall_time_s, 3),
        epochs_done=epochs_done,
        epoch_time_s=epoch_time_s,
        samples_per_s=samples_per_s,
    )


def _remote_cores(spec: ClusterSpec) -> int | None:
    return spec.vcpus_per_node * spec.node_count if spec.vcpus_per_node else None


def summarize_metrics(path: Path) -> tuple[int, float | None, float | None]:
    """(epochs, median epoch_time_s, median samples_per_s) of a metrics.jsonl."""
    if not path.exists():
        return 0, None, None
    times: list[float] = []
    rates: list[float] = []
    epochs = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line of an interrupted run
        epochs += 1
        if isinstance(record.get("epoch_time_s"), int | float):
            times.append(float(record["epoch_time_s"]))
        if isinstance(record.get("samples_per_s"), int | float):
            rates.append(float(record["samples_per_s"]))
    return (
        epochs,
        statistics.median(times) if times else None,
        statistics.median(rates) if rates else None,
    )


def format_sweep_table(result: SweepResult) -> str:
    """Epoch time against workers, with speedup and efficiency relative to the first run."""
    header = (
        "workers",
        "nodes x procs",
        "threads",
        "epoch time (s)",
        "samples/s",
        "speedup",
        "efficiency",
        "note",
    )
    base = next((r for r in result.runs if r.epoch_time_s), None)
    rows: list[tuple[str, ...]] = []
    for run in result.runs:
        speedup = efficiency = "-"
        if base is not None and base.epoch_time_s and run.epoch_time_s:
            s = base.epoch_time_s / run.epoch_time_s
            speedup = f"{s:.2f}"
            efficiency = f"{100 * s / (run.workers / base.workers):.0f}%"
        note: str = run.status if run.status != "done" else ""
        if run.oversubscribed:
            note = (note + "; " if note else "") + (
                f"oversubscribed ({run.workers} workers > {run.cores} cores)"
            )
        rows.append(
            (
                str(run.workers),
                f"{run.nodes} x {run.processes_per_node}",
                "-" if run.threads_per_worker is None else str(run.threads_per_worker),
                "-" if run.epoch_time_s is None else f"{run.epoch_time_s:.3f}",
                "-" if run.samples_per_s is None else f"{run.samples_per_s:.1f}",
                speedup,
                efficiency,
                note,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: tuple[str, ...]) -> str:
        # numbers right-aligned, the note left as it is
        aligned = [c.rjust(w) for c, w in zip(cells[:-1], widths, strict=False)]
        return "  ".join([*aligned, cells[-1]]).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
