"""The Dask engine: a job's ranks run inside the workers of a Dask cluster.

A job that forms a process group (training) gets one rank per worker: on the embedded
LocalCluster every worker (targetNodeCount x processesPerNode of them, one machine), on a
scheduler's cluster `processesPerNode` workers on each of `targetNodeCount` worker hosts.
MASTER_ADDR is rank 0's worker host, MASTER_PORT a port found free there by a task on that
worker; each rank is one task pinned to its worker (`workers=[address]`, no other worker
allowed, no retries: a rank cannot be redone alone) that runs the entry module inside the
worker process (`cluster.dask.rank`), its output in `logs/rank-<i>.log` of the run dir (or of
a `landcover-dask-*` folder in the temporary directory for a job without a local output,
removed when the job succeeds and named when it fails). A rank that fails makes the job fail
with its one-line error (`cluster.failures`): a rank that refused its input with the line one
process prints, a crash with the logs' place; the other ranks' workers are then restarted,
since a rank blocked in a collective would otherwise wait for the one that is gone. A rank
whose worker dies is the cause even when another rank, left alone in a collective, failed
first: "rank 1 (worker tcp://...) died: killed by signal 9" (the exit status from its
nanny). Ctrl-C stops the ranks too. The LocalCluster a launch starts has one worker a rank,
and more ranks than this machine's cores are refused when the job is planned.

Jobs without a process group (tile and predict, `Job.process_group` False) run the same way,
one rank per worker, coordinating through their output as on every engine; landcover runs
those stages as tasks instead where the engine `runs_tasks` (`cluster.dask.client.TaskRunner`).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cluster.dask.client import dask_client, import_distributed, worker_hosts
from cluster.dask.places import RankPlace, assign_ranks, rank_environment
from cluster.dask.rank import death_of, free_port, run_rank, watch_worker_exit, worker_exit
from cluster.dask.section import DaskSpec
from cluster.engine import Job, LaunchOptions, LaunchResult, PlanEngine, job_redactor
from cluster.errors import LaunchError
from cluster.failures import ERROR_DIR_ENV, clear_worker_errors, first_worker_error
from cluster.redact import REDACTED, Redactor
from cluster.spec import ClusterSpec
from tiling.runtime.urls import is_local

logger = logging.getLogger(__name__)

# how often the launch checks that every rank's worker is still in the cluster
_WATCH_S = 1.0
# how long a rank that crashed is given for another rank's worker to be seen gone: a rank
# whose worker dies makes the others fail in their next collective, often before the
# scheduler has removed the dead worker, and the death is the cause to report
_DEATH_GRACE_S = 5.0
_TEMP_LOGS_PREFIX = "landcover-dask-"


@dataclass(frozen=True, slots=True)
class DaskPlan:
    """What a Dask launch does; `client` is a `distributed.Client` a caller already holds
    (None: the spec's cluster, `cluster.dask.client.dask_client`)."""

    spec: ClusterSpec
    job: Job
    log_dir: str
    threads_per_worker: int | None
    redactor: Redactor = field(repr=False, compare=False)
    client: Any = field(default=None, repr=False, compare=False)
    engine: str = "dask"

    @property
    def dask(self) -> DaskSpec:
        return self.spec.section_of(DaskSpec) or DaskSpec()

    def describe(self) -> str:
        spec, r = self.spec, self.redactor
        layout = (
            f"{spec.workers} worker(s) on this machine"
            if self.dask.embedded and self.client is None
            else f"{spec.processes_per_node} worker(s) on each of {spec.node_count} worker host(s)"
        )
        where = (
            "a distributed.Client given by the caller"
            if self.client is not None
            else self.dask.describe(spec.workers)
        )
        work = f"ranks: {spec.workers} ({layout}), one task pinned to each worker running " + (
            "the job in the worker process; MASTER_ADDR = rank 0's worker host, a free port there"
            if self.job.process_group
            else "its share in the worker process; the ranks coordinate through the output"
        )
        command = " ".join(shlex.quote(a) for a in r.args(self.job.bound_argv()))
        return "\n".join(
            [
                "engine: dask",
                f"cluster: {spec.name}: {where}",
                work,
                *(f"input {k}: {r.text(v)}" for k, v in self.job.inputs.items()),
                *(f"output {k}: {r.text(v)}" for k, v in self.job.outputs.items()),
                f"logs: {Path(self.log_dir) / 'rank-<i>.log'}",
                "environment: "
                + " ".join(
                    (
                        [f"OMP_NUM_THREADS={self.threads_per_worker}"]
                        if self.threads_per_worker
                        else []
                    )
                    + [f"{k}={REDACTED}" for k in self.job.secret_env]
                ),
                f"command (each rank): python -m {self.job.entry_module} {command}",
                *(f"note: {n}" for n in spec.notes),
            ]
        )

    def files(self) -> dict[str, str]:
        """No files: a Dask job is submitted from this process."""
        return {}

    @property
    def temporary_logs(self) -> bool:
        """Whether the logs go to a folder of our own in the temporary directory (a job
        without a local output dir), removed once the job succeeds."""
        return Path(self.log_dir).name.startswith(_TEMP_LOGS_PREFIX)


def plan_dask(spec: ClusterSpec, job: Job, *, client: Any = None) -> DaskPlan:
    """The plan of `job` on `spec`'s Dask cluster (or on `client`)."""
    from cluster.engine import threads_per_worker

    dask = spec.section_of(DaskSpec) or DaskSpec()
    if client is None and dask.embedded:
        dask.local_workers(spec.workers, ranks=True)  # one worker a rank: this machine's cores
    out = job.output_dir
    log_dir = (
        str(Path(out) / "logs")
        if out is not None and is_local(out)
        else str(Path(tempfile.gettempdir()) / f"{_TEMP_LOGS_PREFIX}{uuid.uuid4().hex[:8]}")
    )
    return DaskPlan(
        spec=spec,
        job=job,
        log_dir=log_dir,
        threads_per_worker=threads_per_worker(spec),
        redactor=job_redactor(spec, job),
        client=client,
    )


def launch_dask(plan: DaskPlan, options: LaunchOptions) -> LaunchResult:
    """Run the plan's ranks in the workers of its cluster, until they are done."""
    started = time.monotonic()
    with dask_client(plan.spec, client=plan.client, ranks=True) as client:
        run_ranks(client, plan, timeout_s=options.timeout_s)
    out = plan.job.output_dir
    if plan.temporary_logs:  # a success leaves nothing in $TMPDIR; a failure keeps them
        shutil.rmtree(plan.log_dir, ignore_errors=True)
    return LaunchResult(
        engine="dask",
        job_id=Path(plan.log_dir).parent.name if out else Path(plan.log_dir).name,
        status="succeeded",
        run_dir=out if out is not None and is_local(out) else None,
        log_location=None if plan.temporary_logs else plan.log_dir,
        wall_time_s=time.monotonic() - started,
    )


class DaskEngine(PlanEngine[DaskPlan]):
    """Runs a job's ranks in the workers of a Dask cluster."""

    plan_type = DaskPlan
    make_plan = staticmethod(plan_dask)
    run = staticmethod(launch_dask)


def run_ranks(client: Any, plan: DaskPlan, *, timeout_s: float | None = None) -> None:
    """Run the plan's job as one rank per chosen worker and wait for every rank; LaunchError
    with the first failing rank's one-line error (see the module docstring)."""
    spec, job = plan.spec, plan.job
    one_host = plan.client is None and plan.dask.embedded
    places = assign_ranks(
        worker_hosts(client),
        nodes=spec.node_count,
        per_node=spec.processes_per_node,
        one_host=one_host,
    )
    log_dir = Path(plan.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    clear_worker_errors(log_dir)
    for place in places:
        (log_dir / f"rank-{place.rank}.log").unlink(missing_ok=True)
    master_worker = places[0]
    port = client.submit(
        free_port, workers=[master_worker.worker], allow_other_workers=False, pure=False
    ).result()
    master = (master_worker.host, int(port))
    threads = {"OMP_NUM_THREADS": str(plan.threads_per_worker)} if plan.threads_per_worker else {}
    logger.info(
        "dask: %d rank(s) on %s; master %s:%d; logs in %s",
        len(places),
        ", ".join(p.worker for p in places),
        *master,
        log_dir,
    )
    futures = [
        client.submit(
            run_rank,
            job.entry_module,
            job.bound_argv(),
            {
                **threads,
                **job.secret_env,
                **rank_environment(place, world=len(places), master=master),
                ERROR_DIR_ENV: str(log_dir),
            },
            str(log_dir / f"rank-{place.rank}.log"),
            workers=[place.worker],
            allow_other_workers=False,
            pure=False,
            retries=0,
            key=f"rank-{place.rank}-{uuid.uuid4().hex[:8]}",
        )
        for place in places
    ]
    deaths = _DeathWatch.start(client, places)
    try:
        failure = _wait_for_ranks(
            client, futures, places, timeout_s=timeout_s, log_dir=log_dir, deaths=deaths
        )
    except BaseException:  # Ctrl-C: the ranks stop with the launch
        _stop_ranks(client, futures, places)
        raise
    if failure is None:
        return
    _stop_ranks(client, futures, places)
    worker_error = first_worker_error(log_dir)
    if not failure.died and worker_error is not None and worker_error.bad_input:
        # a refused input: the rank's one line, as one process says it (cluster.failures)
        said = plan.redactor.text(worker_error.message)
        if plan.temporary_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        raise LaunchError(said, worker_error=replace(worker_error, message=said))
    reason = (
        worker_error.message if worker_error is not None and not failure.died else failure.message
    )
    raise LaunchError(
        plan.redactor.text(f"dask job failed: {reason} (logs: {log_dir})"),
        worker_error=worker_error,
    )


@dataclass(frozen=True, slots=True)
class _Failure:
    """What went wrong first, in words; `died`: a rank's worker died."""

    message: str
    died: bool = False


@dataclass(frozen=True, slots=True)
class _DeathWatch:
    """The ranks' workers' nannies, asked to remember how their worker process ends
    (`cluster.dask.rank.watch_worker_exit`), so that a rank whose worker died is reported as
    "rank 1 (worker tcp://...) died: killed by signal 9"; workers without a nanny are simply
    said to have left the cluster."""

    client: Any
    nannies: Mapping[str, str]  # worker address → its nanny's address

    @classmethod
    def start(cls, client: Any, places: Sequence[RankPlace]) -> _DeathWatch:
        workers = [p.worker for p in places]
        info = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
        nannies = {w: str(info[w]["nanny"]) for w in workers if info.get(w, {}).get("nanny")}
        if nannies:
            try:
                client.run(watch_worker_exit, workers=list(nannies), nanny=True)
            except Exception as exc:  # only the words of a death depend on it
                logger.debug("cannot watch the Dask workers' exits: %s", exc)
                nannies = {}
        return cls(client, nannies)

    def death(self, place: RankPlace) -> str:
        """How `place`'s worker died, in one line."""
        return f"rank {place.rank} (worker {place.worker}) died: {death_of(self._exit(place))}"

    def _exit(self, place: RankPlace) -> int | None:
        """The exit status of `place`'s dead worker, asked of its nanny through the worker it
        restarted (the scheduler reaches a nanny only through a live worker of its own)."""
        nanny = self.nannies.get(place.worker)
        if nanny is None:
            return None
        deadline = time.monotonic() + _DEATH_GRACE_S
        while True:
            info = self.client.sync(self.client.scheduler.identity, n_workers=-1)["workers"]
            restarted = [w for w, i in info.items() if str(i.get("nanny")) == nanny]
            if restarted:
                try:
                    said = self.client.run(
                        worker_exit, place.worker, workers=restarted[:1], nanny=True
                    )
                except Exception:
                    return None
                status = next(iter(said.values()), None)
                return status if isinstance(status, int) else None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)


def _wait_for_ranks(
    client: Any,
    futures: Sequence[Any],
    places: Sequence[RankPlace],
    *,
    timeout_s: float | None,
    log_dir: Path,
    deaths: _DeathWatch,
) -> _Failure | None:
    """None once every rank ended with status 0; else what went wrong first. A rank whose
    worker died is the cause even where another rank failed first, in the collective that
    lost it, unless that rank refused its input."""
    distributed = import_distributed()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        pending = [f for f in futures if not f.done()]
        if pending:
            with contextlib.suppress(distributed.TimeoutError):
                distributed.wait(pending, timeout=_WATCH_S, return_when="FIRST_COMPLETED")
        gone = _gone(client, futures, places)
        if gone is not None:
            return _Failure(deaths.death(gone), died=True)
        failed = _first_failed(futures, places)
        if failed is not None:
            said = first_worker_error(log_dir)
            if said is None or not said.bad_input:
                gone = _gone(client, futures, places, grace_s=_DEATH_GRACE_S)
                if gone is not None:
                    return _Failure(deaths.death(gone), died=True)
            return _Failure(failed)
        if all(f.status == "finished" for f in futures):
            return None
        if deadline is not None and time.monotonic() > deadline:
            return _Failure(f"the job ran past --timeout {timeout_s:g} s")


def _first_failed(futures: Sequence[Any], places: Sequence[RankPlace]) -> str | None:
    """The first rank that raised or ended with a non-zero status, in words."""
    for place, future in zip(places, futures, strict=True):
        if future.status == "error":
            error = future.exception()
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return f"rank {place.rank} on {place.worker}: {first}"
        if future.status == "finished" and future.result() != 0:
            return f"rank {place.rank} on {place.worker} exited with status {future.result()}"
    return None


def _gone(
    client: Any, futures: Sequence[Any], places: Sequence[RankPlace], *, grace_s: float = 0.0
) -> RankPlace | None:
    """The first rank still running whose worker is no longer in the cluster, looking again
    for up to `grace_s` seconds while ranks are still running."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = set(worker_hosts(client))
        running = [(p, f) for p, f in zip(places, futures, strict=True) if not f.done()]
        for place, _ in running:
            if place.worker not in alive:
                return place
        if not running or time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def _stop_ranks(client: Any, futures: Sequence[Any], places: Sequence[RankPlace]) -> None:
    """Cancel the ranks still running and restart their workers: a rank blocked in a
    collective waits for the others forever otherwise (a cancelled task keeps running)."""
    running = [p.worker for p, f in zip(places, futures, strict=True) if not f.done()]
    client.cancel(list(futures))
    if not running:
        return
    alive = set(worker_hosts(client))
    try:
        client.restart_workers(
            [w for w in running if w in alive], timeout=60, raise_for_error=False
        )
    except Exception as exc:  # a worker without a nanny cannot be restarted: said, not fatal
        logger.warning("could not restart the Dask workers of the stopped ranks: %s", exc)
