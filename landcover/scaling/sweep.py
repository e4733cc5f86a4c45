"""Scaling sweeps: the same training at several worker counts, one run dir each.

`run_sweep` trains at every worker count N into `DIR/workers-N` (the local engine on this
machine unless a cluster spec is given; a remote engine's job is awaited and its run dir
fetched, so the runs are measured one after another under the same conditions). Each run keeps
the trainer's own files (metrics.jsonl, run.json, ...). A rerun reuses the runs that finished
(unless `overwrite`) and redoes the others from scratch.

On the local engine, N workers are one node with N processes (or, with a cluster spec, N /
processesPerNode simulated nodes), each with max(1, cores // N) threads. More workers than
cores is allowed but marked `oversubscribed`: such a point measures time-slicing, not scaling.

After every run, `DIR/sweep.json` (the typed record of `landcover.scaling.sweepfile`, fields
in docs/CONTRACTS.md) is rewritten atomically, so a partial sweep is readable; each finished
run is also written alone as `DIR/workers-N/launch.json`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.engine import (
    DEFAULT_ENTRY_MODULE,
    LaunchOptions,
    TrainJob,
    job_redactor,
    launch_plan,
    plan_job,
    threads_per_worker,
)
from cluster.errors import ClusterError, LaunchError
from cluster.redact import Redactor
from cluster.spec import ClusterSpec, ElasticSpec, local_cpu_count, local_spec
from landcover.scaling.metricsfile import read_finished_epochs
from landcover.scaling.sweepfile import (
    SWEEP_FILE,
    RunStatus,
    SweepRecord,
    SweepRun,
    read_sweep,
    write_launch,
    write_sweep,
)
from landcover.training.records import steady_epoch_time_s, steady_samples_per_s
from landcover.training.rundir import METRICS_FILE

__all__ = [
    "RUN_PREFIX",
    "SweepConfig",
    "SweepResult",
    "SweepRun",
    "check_extra_args",
    "format_sweep_table",
    "parse_worker_counts",
    "run_sweep",
    "spec_for_workers",
    "summarize_metrics",
]

logger = logging.getLogger(__name__)

RUN_PREFIX = "workers-"
_RESERVED_ARGS = ("--out", "--epochs", "--nproc")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """One sweep: the store, the worker counts, epochs per run, where the runs go;
    `secret_env` reaches every run's workers as `TrainJob.secret_env` does."""

    store: str
    workers: tuple[int, ...]
    epochs: int
    out_dir: str
    extra_args: tuple[str, ...] = ()
    cluster: ClusterSpec | None = None
    entry_module: str = DEFAULT_ENTRY_MODULE
    overwrite: bool = False
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What `run_sweep` did: where sweep.json is, this machine's cores, every run."""

    path: Path  # DIR/sweep.json
    cores: int
    runs: tuple[SweepRun, ...]

    @property
    def failed(self) -> tuple[SweepRun, ...]:
        return tuple(r for r in self.runs if r.status == "failed")

    def run_path(self, run: SweepRun) -> Path:
        """The run directory of `run`, one of `runs`: DIR/workers-N."""
        return self.path.parent / (run.run_dir or f"{RUN_PREFIX}{run.workers}")


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
    check_extra_args(config.extra_args)
    options = replace(options or LaunchOptions(), wait=True)
    out = Path(config.out_dir)
    redactor = job_redactor(
        config.cluster or local_spec(1), _job(config, str(out / f"{RUN_PREFIX}1"))
    )
    record = _record(config, redactor)
    sweep_path = out / SWEEP_FILE
    previous = _previous_runs(sweep_path, record, config.overwrite)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[SweepRun] = []
    for workers in config.workers:
        spec = spec_for_workers(config.cluster, workers)
        run_dir = out / f"{RUN_PREFIX}{workers}"
        reused = previous.get(workers)
        if reused is not None and (run_dir / METRICS_FILE).exists():
            logger.info("reusing the finished run %s", run_dir)
            run = reused
        else:
            run = _run_one(config, spec, run_dir, options, redactor)
            if run_dir.is_dir():
                write_launch(run_dir, run)
        runs.append(run)
        write_sweep(sweep_path, record.model_copy(update={"updated": _now(), "runs": tuple(runs)}))
        if on_run is not None:
            on_run(run)
    return SweepResult(path=sweep_path, cores=local_cpu_count(), runs=tuple(runs))


def _record(config: SweepConfig, redactor: Redactor) -> SweepRecord:
    """The sweep.json of `config` before its first run."""
    spec = config.cluster
    return SweepRecord(
        engine=spec.engine if spec else "local",
        cluster=spec.name if spec else "local",
        vm_size=spec.vm_size if spec else "local",
        host=socket.gethostname(),
        cores=local_cpu_count(),
        store=redactor.text(config.store),
        epochs=config.epochs,
        train_args=tuple(redactor.args(config.extra_args)),
        entry_module=config.entry_module,
        created=_now(),
        updated=None,
        runs=(),
    )


def _previous_runs(path: Path, record: SweepRecord, overwrite: bool) -> dict[int, SweepRun]:
    """Finished runs of an earlier sweep of the same settings in the same DIR."""
    if overwrite or not path.exists():
        return {}
    old = read_sweep(path)
    changed = old.differences(record)
    if changed:
        raise ClusterError(
            f"{path.parent} holds a sweep with other settings ({', '.join(changed)} differ); "
            "pass --overwrite to replace it or choose another --out"
        )
    return {r.workers: r for r in old.runs if r.status == "done"}


def _job(config: SweepConfig, run_dir: str) -> TrainJob:
    return TrainJob(
        store=config.store,
        out=run_dir,
        args=("--epochs", str(config.epochs), *config.extra_args),
        entry_module=config.entry_module,
        secret_env=config.secret_env,
    )


def _run_one(
    config: SweepConfig,
    spec: ClusterSpec,
    run_dir: Path,
    options: LaunchOptions,
    redactor: Redactor,
) -> SweepRun:
    if run_dir.exists():  # an unfinished or replaced run of ours: never trusted
        shutil.rmtree(run_dir)
    plan = plan_job(spec, _job(config, str(run_dir)))
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
    epochs_done, epoch_time_s, samples_per_s = summarize_metrics(run_dir / METRICS_FILE)
    if log_dir is not None and Path(log_dir).is_relative_to(run_dir.parent):
        log_dir = str(Path(log_dir).relative_to(run_dir.parent))
    return SweepRun(
        workers=spec.workers,
        nodes=spec.node_count,
        processes_per_node=spec.processes_per_node,
        threads_per_worker=_given_threads(config.extra_args) or threads_per_worker(spec),
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


def _given_threads(args: tuple[str, ...]) -> int | None:
    """The user's own --threads N (it wins over the fair share the engine would add)."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--threads=") else None
        if arg == "--threads" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _remote_cores(spec: ClusterSpec) -> int | None:
    return spec.vcpus_per_node * spec.node_count if spec.vcpus_per_node else None


def summarize_metrics(path: Path) -> tuple[int, float | None, float | None]:
    """(epochs, epoch time, samples per second) of a metrics.jsonl, by the one rule the report
    uses too (`steady_epoch_time_s`, `steady_samples_per_s`); a torn line is skipped."""
    records = read_finished_epochs(path)
    if not records:
        return 0, None, None
    return len(records), steady_epoch_time_s(records), steady_samples_per_s(records)


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


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
