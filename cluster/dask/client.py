"""A client of the Dask cluster a spec names, and units of work run on it as tasks.

`dask_client(spec)` starts the embedded LocalCluster (no `dask.scheduler`: at most one worker
per core for tasks, no dashboard) and closes it at the end, or connects to the scheduler (a
closed port is said at once); a `distributed.Client` the caller already holds is used as it
is and left open (a closed one is one line). `TaskRunner` runs a function over units of work
(a source, a tile) as one task each: retried when its worker is lost (the unit is redone
elsewhere), followed by a progress bar on a terminal (or a log line per tenth), the rest
cancelled when one fails or on Ctrl-C, results in unit order. A unit that raises is not
retried: its exception is raised here as it was raised there (`cluster.dask.remote`), so the
CLI says what one process says.
"""

from __future__ import annotations

import logging
import socket
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from cluster.dask.remote import TaskFailure, raise_failure, run_capturing
from cluster.errors import EngineUnavailableError, LaunchError
from cluster.spec import ClusterSpec

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

U = TypeVar("U")
R = TypeVar("R")

TASK_RETRIES = 2


def import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise EngineUnavailableError(
            'engine "dask" needs Dask: pip install "landcover[dask]"'
        ) from None
    return distributed


@contextmanager
def dask_client(
    spec: ClusterSpec | None = None, *, client: Client | None = None, ranks: bool = False
) -> Iterator[Client]:
    """A client for `spec`'s Dask cluster (see the module docstring), or `client` itself.
    `ranks`: the job runs one rank per worker (training, a one-COG prediction), so the
    embedded LocalCluster needs all of targetNodeCount x processesPerNode workers; tasks
    run on as many as this machine has cores (`DaskSpec.local_workers`)."""
    if client is not None:
        check_open(client)
        yield client
        return
    distributed = import_distributed()
    from cluster.dask.section import DaskSpec  # pydantic: only where a cluster is made

    dask = (spec.section_of(DaskSpec) if spec is not None else None) or DaskSpec()
    if dask.embedded:
        workers = dask.local_workers(spec.workers if spec is not None else 1, ranks=ranks)
        with (
            _quiet_scheduler(),
            distributed.LocalCluster(
                n_workers=workers,
                threads_per_worker=dask.threads_per_worker or 1,
                processes=True,
                dashboard_address=None,
                # distributed starts the dashboard's HTTP server on 0.0.0.0:8787 even with
                # dashboard_address=None: no dashboard, its health routes on loopback only
                scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.ERROR,
            ) as cluster,
            distributed.Client(cluster) as local,
        ):
            yield local
        return
    assert dask.scheduler is not None  # not embedded
    check_reachable(dask.scheduler, timeout_s=dask.connect_timeout_s)
    try:
        remote = distributed.Client(dask.scheduler, timeout=dask.connect_timeout)
    except (OSError, TimeoutError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LaunchError(
            f"cannot reach the Dask scheduler at {dask.scheduler} ({first}); start it "
            "(`dask scheduler`) or fix dask.scheduler in cluster.json"
        ) from None
    with remote:
        yield remote


def check_reachable(scheduler: str, *, timeout_s: float) -> None:
    """One line at once when nothing listens at the scheduler's TCP address (connection
    refused), or its host does not resolve or cannot be reached within `timeout_s`, instead of
    the client retrying until its timeout and saying only that it timed out. Addresses of
    other protocols (ucx://) are left to the client."""
    from cluster.dask.section import DEFAULT_SCHEDULER_PORT, split_scheduler_address

    protocol, host, port = split_scheduler_address(scheduler)
    if protocol not in ("tcp", "tls", "ws", "wss"):
        return
    fix = "start it (`dask scheduler`) or fix dask.scheduler in cluster.json"
    try:
        with socket.create_connection((host, port or DEFAULT_SCHEDULER_PORT), timeout=timeout_s):
            return
    except ConnectionRefusedError:
        reason = "connection refused: nothing listens on that port"
    except socket.gaierror as exc:
        reason = f"host {host!r} does not resolve: {exc.strerror or exc}"
    except TimeoutError:
        reason = f"no answer within {timeout_s:g} s"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    raise LaunchError(f"cannot reach the Dask scheduler at {scheduler} ({reason}); {fix}")


def check_open(client: Any) -> None:
    """One line for a `distributed.Client` that is closed (or closing): it can run nothing."""
    status = getattr(client, "status", "running")
    if status in ("closing", "closed"):
        raise LaunchError(
            f"the distributed.Client given is {status}: pass an open one "
            "(distributed.Client(scheduler_address)) or a cluster.json path"
        )


@contextmanager
def _quiet_scheduler() -> Iterator[None]:
    """The embedded scheduler and nannies run in this process: their INFO lines (workers
    added, closed) are Dask's bookkeeping, not the job's, and so is a nanny's warning that it
    killed a worker at close (a rank's torch threads outlive its task); other warnings and
    errors still show."""
    levels = {"distributed": logging.WARNING, "distributed.nanny": logging.ERROR}
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(max(saved[name], level))
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def worker_hosts(client: Any) -> dict[str, str]:
    """Every worker's address → its host, as the scheduler knows them."""
    # asked of the scheduler itself: `Client.scheduler_info` returns a cache that the client's
    # periodic refresh replaces with one that lists no workers
    info = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    return {address: str(worker["host"]) for address, worker in sorted(info.items())}


@dataclass(frozen=True, slots=True)
class TaskRunner:
    """Runs units of work as tasks on `client` (see the module docstring). `show_progress`
    None: a bar when stderr is a terminal."""

    client: Any  # a distributed.Client (untyped)
    retries: int = TASK_RETRIES
    show_progress: bool | None = None

    def __call__(
        self,
        fn: Callable[..., R],
        units: Sequence[U],
        *,
        shared: Sequence[Any] = (),
        what: str = "units",
    ) -> list[R]:
        """`[fn(*shared, u) for u in units]`, each a task; `shared` is sent to the cluster
        once (scattered), not with every task."""
        if not units:
            return []
        batch = uuid.uuid4().hex[:8]
        check_open(self.client)
        scattered = [self.client.scatter([value], hash=False)[0] for value in shared]
        futures = [
            self.client.submit(
                run_capturing,
                fn,
                *scattered,
                unit,
                retries=self.retries,
                pure=False,
                key=f"{what}-{batch}-{i}",
            )
            for i, unit in enumerate(units)
        ]
        with _Progress(len(futures), what, self.show_progress) as advance:
            results = wait_for_tasks(self.client, futures, what=what, on_done=advance)
        return results


def wait_for_tasks(
    client: Any,
    futures: Sequence[Any],
    *,
    what: str,
    on_done: Callable[[], None] = lambda: None,
) -> list[Any]:
    """The results of `futures` (tasks of `run_capturing`), in their order. A task that fails
    raises here what it raised there (`cluster.dask.remote`), or one line for a task whose
    workers all died; where several fail, the first in order, once the tasks before it are
    done: the unit one process would have failed on, so the job says what one process says.
    Failed, interrupted or done, nothing of the batch keeps running."""
    distributed = import_distributed()
    order = {future.key: i for i, future in enumerate(futures)}
    failed: dict[int, Any] = {}  # index → the failed future
    try:
        for future in distributed.as_completed(futures):
            index = order[future.key]
            if future.status == "cancelled":
                continue
            if future.status == "error" or isinstance(future.result(), TaskFailure):
                failed[index] = future
                client.cancel([f for f in futures[index + 1 :] if not f.done()])
            else:
                on_done()
            if failed and all(f.done() for f in futures[: min(failed)]):
                break
        if failed:
            first = failed[min(failed)]
            if first.status == "error":
                _raise_task_error(first, futures, what)
            raise_failure(first.result())
        return [future.result() for future in futures]
    finally:
        client.cancel([f for f in futures if not f.done()])


def _raise_task_error(future: Any, futures: Sequence[Any], what: str) -> None:
    """Raise the error Dask itself gave a task: one line for a task whose every worker died
    (KilledWorker); anything else as it came."""
    from distributed.scheduler import KilledWorker

    error = future.exception()
    if isinstance(error, KilledWorker):
        index = list(futures).index(future)
        last = getattr(error.last_worker, "address", error.last_worker)
        raise LaunchError(
            f"{what}: task {index + 1} of {len(futures)} ({error.task}) killed each of the "
            f"{error.allowed_failures + 1} workers that ran it, the last {last}: see that "
            "worker's log (out of memory? a crash in a native library?)"
        ) from None
    future.result()  # raises the task's error


@contextmanager
def _Progress(total: int, what: str, show: bool | None) -> Iterator[Callable[[], None]]:  # noqa: N802
    """A tqdm bar over `total` tasks on a terminal, else an INFO line every tenth."""
    bar: Any = None
    if show if show is not None else sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, desc=what, unit="task")
    done = [0]

    def advance() -> None:
        done[0] += 1
        if bar is not None:
            bar.update(1)
        elif done[0] == total or done[0] % max(1, total // 10) == 0:
            logger.info("%s: %d of %d tasks done", what, done[0], total)

    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()
