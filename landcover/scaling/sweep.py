"""Scaling sweeps: the same training at several worker counts, one run dir each.

`run_sweep` trains at every worker count N into `DIR/workers-N` (the local engine on this
machine unless a cluster spec is given; a remote engine's job is awaited and its run dir
fetched, so the runs are measured one after another under the same conditions). Each run keeps
the trainer's own files (metrics.jsonl, run.json, ...). A rerun reuses the runs that finished
(unless `overwrite`) and redoes the others from scratch.

On the local engine, N workers are one node with N processes (or, with a cluster spec, N /
processesPerNode simulated nodes). Every point of a sweep gets the same per-worker resources,
as adding a node does on a cluster: `--threads` when given, else the threads a worker gets at
the sweep's LARGEST worker count (`sweep_threads`; on the local engine max(1, cores // max N)).
A sweep that gave N workers cores // N threads each would run every point on the same cores
and compare threads with processes, not measure scaling. More workers than cores is allowed
but marked `oversubscribed`: such a point measures time-slicing, not scaling.

After every run, `DIR/sweep.json` (the typed record of `landcover.scaling.sweepfile`, fields
in docs/CONTRACTS.md) is rewritten atomically, so a partial sweep is readable; each finished
run is also written alone as `DIR/workers-N/launch.json`. sweep.json lists this sweep's runs
only, and the report reads only what it lists. A finished run is reused only when it had this
sweep's per-worker resources (threads per worker, nodes x processes). `overwrite` first
removes the run directories the previous sweep.json recorded, and nothing else, so no run of
an earlier sweep with other worker counts stays beside the new ones.

`on_progress` gets each run's epoch lines as its rank 0 logs them (`landcover.training.progress`),
picked out of the worker output that the launch passes on.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.engine import (
    Job,
    LaunchOptions,
    job_redactor,
    launch_plan,
    plan_job,
    threads_per_worker,
)
from cluster.engines import engine_info
from cluster.errors import ClusterError, LaunchError
from cluster.redact import Redactor
from cluster.spec import ClusterSpec, ElasticSpec, local_spec
from landcover.scaling.curves import speedup_by_workers
from landcover.scaling.metricsfile import read_finished_epochs
from landcover.scaling.sweepfile import (
    SWEEP_FILE,
    RunStatus,
    SweepRecord,
    SweepRun,
    write_launch,
    write_sweep,
)
from landcover.scaling.sweepreuse import (
    SWEEP_RERUN_MAY_CHANGE,
    SWEEP_RERUN_MUST_MATCH,
    previous_runs,
    remove_recorded_runs,
    same_resources,
)
from landcover.training.config import TrainConfig, parse_training, train_parser
from landcover.training.launch import WORKER_MODULE, training_job, worker_config
from landcover.training.progress import progress_message
from landcover.training.records import steady_epoch_time_s, steady_samples_per_s
from landcover.training.rundir import METRICS_FILE
from tiling.runtime.machine import local_cpu_count

__all__ = [
    "RUN_PREFIX",
    "SWEEP_RERUN_MAY_CHANGE",
    "SWEEP_RERUN_MUST_MATCH",
    "SweepConfig",
    "SweepResult",
    "SweepRun",
    "format_sweep_table",
    "parse_worker_counts",
    "run_sweep",
    "spec_for_workers",
    "summarize_metrics",
    "sweep_threads",
]

logger = logging.getLogger(__name__)

RUN_PREFIX = "workers-"
_SET_BY_SWEEP = ("out_dir", "epochs", "nproc")  # its run dirs, its epochs, its workers


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


def run_sweep(
    config: SweepConfig,
    options: LaunchOptions | None = None,
    *,
    on_run: Callable[[SweepRun], None] | None = None,
    on_progress: Callable[[int, str], None] | None = None,
) -> SweepResult:
    """Train at each worker count; returns every run (failed ones included, never raised).
    `on_progress(workers, line)`: a run's epoch lines, as they come."""
    training, stand_in_args = sweep_training(config)
    options = replace(options or LaunchOptions(), wait=True)
    out = Path(config.out_dir)
    redactor = job_redactor(
        config.cluster or local_spec(1),
        training_job(local_spec(1), training, extra_args=stand_in_args),
    )
    record = _record(config, redactor)
    sweep_path = out / SWEEP_FILE
    # every point's spec before any run: a worker count the cluster cannot run is refused now
    specs = {workers: spec_for_workers(config.cluster, workers) for workers in config.workers}
    previous = previous_runs(sweep_path, record, config.overwrite)
    if config.overwrite:
        remove_recorded_runs(sweep_path)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[SweepRun] = []
    if config.overwrite or not sweep_path.exists():
        write_sweep(sweep_path, record)  # lists no run until the first one ends
    for workers in config.workers:
        spec = specs[workers]
        run_dir = out / f"{RUN_PREFIX}{workers}"
        reused = previous.get(workers)
        if reused is not None and not same_resources(reused, spec, training.threads):
            logger.info("not reusing %s: it ran with other per-worker resources", run_dir)
            reused = None
        if reused is not None and (run_dir / METRICS_FILE).exists():
            logger.info("reusing the finished run %s", run_dir)
            run = reused
        else:
            point = replace(training, out_dir=str(run_dir))
            job = training_job(
                spec, point, entry_module=config.entry_module, extra_args=stand_in_args
            )
            launch = _with_progress(options, workers, on_progress)
            run = _run_one(spec, job, worker_config(spec, point), launch, redactor)
            if run_dir.is_dir():
                write_launch(run_dir, run)
        runs.append(run)
        write_sweep(sweep_path, record.model_copy(update={"updated": _now(), "runs": tuple(runs)}))
        if on_run is not None:
            on_run(run)
    return SweepResult(path=sweep_path, cores=local_cpu_count(), runs=tuple(runs))


def _with_progress(
    options: LaunchOptions, workers: int, on_progress: Callable[[int, str], None] | None
) -> LaunchOptions:
    """`options` whose worker output also feeds the epoch lines in it to `on_progress`."""
    if on_progress is None:
        return options
    shown = options.on_output

    def output(line: str) -> None:
        if shown is not None:
            shown(line)
        message = progress_message(line)
        if message is not None:
            on_progress(workers, message)

    return replace(options, on_output=output)


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


def sweep_training(config: SweepConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """The training configuration of every run (its run dir aside: the first run's), parsed
    from the sweep's store, epochs and `extra_args` by `landcover train`'s click options (the
    options the sweep sets refused by parameter), and the arguments of a stand-in entry module
    that the worker does not take."""
    given = {
        "out_dir": str(Path(config.out_dir) / f"{RUN_PREFIX}{config.workers[0]}"),
        "epochs": config.epochs,
    }
    # STORE first, as `landcover train` takes it: a stand-in's own option values stay its own
    parsed = parse_training(
        [config.store, *config.extra_args],
        command=train_parser,
        defaults=given,
        strict=config.entry_module == WORKER_MODULE,
    )

    def set_by_sweep(flag: str) -> Exception:
        return ClusterError(
            f"{flag} is set by the sweep (--out DIR, --epochs, --workers); "
            "remove it from the training arguments"
        )

    parsed.refuse_given(_SET_BY_SWEEP, set_by_sweep)
    training, stand_in_args = parsed.config, parsed.extra_args
    if training.threads is None:
        training = replace(training, threads=sweep_threads(config.cluster, config.workers))
    return training, stand_in_args


def sweep_threads(cluster: ClusterSpec | None, workers: tuple[int, ...]) -> int | None:
    """Threads per worker at EVERY point of a sweep over `workers`: what a worker gets at the
    largest worker count (local engine: max(1, usable cores // max(workers))), so that each
    added worker adds resources; None where the engine cannot tell (no known VM size)."""
    return threads_per_worker(spec_for_workers(cluster, max(workers)))


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
    local = engine_info(spec.engine).runs_here
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
        threads_per_worker=worker.threads,
        cores=cores,
        # more worker threads than cores: time-slicing, not more resources
        oversubscribed=local and spec.workers * (worker.threads or 1) > local_cpu_count(),
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
    """(epochs, epoch time, samples per second) of a metrics.jsonl, by the one rule the report
    uses too (`steady_epoch_time_s`, `steady_samples_per_s`); a torn line is skipped."""
    records = read_finished_epochs(path)
    if not records:
        return 0, None, None
    return len(records), steady_epoch_time_s(records), steady_samples_per_s(records)


def format_sweep_table(result: SweepResult) -> str:
    """Epoch time against workers, with speed-up and efficiency relative to the first run,
    from samples per second (an epoch trains full batches of the smallest shard only, so
    epochs at different worker counts can train different sample counts); from epoch times
    only where a run recorded no samples per second."""
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
    speedup_at = _speedups(result.runs)
    base_workers = min(speedup_at, default=1)
    rows: list[tuple[str, ...]] = []
    for run in result.runs:
        speedup = efficiency = "-"
        s = speedup_at.get(run.workers) if run.epoch_time_s else None
        if s is not None:
            speedup = f"{s:.2f}"
            efficiency = f"{100 * s / (run.workers / base_workers):.0f}%"
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


def _speedups(runs: Sequence[SweepRun]) -> dict[int, float]:
    """Each measured worker count's speed-up (`speedup_by_workers`), from samples per second,
    or from epoch times where a run recorded no samples per second."""
    timed = [r for r in runs if r.epoch_time_s]
    if not timed:
        return {}
    if all(r.samples_per_s for r in timed):
        return speedup_by_workers([(r.workers, r.samples_per_s or 0.0) for r in timed])
    return speedup_by_workers([(r.workers, 1 / (r.epoch_time_s or 1.0)) for r in timed])


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
