"""A client of the Dask cluster a spec names, and units of work run on it as tasks.

`dask_client(spec)` starts the embedded LocalCluster (no `dask.scheduler`) and closes it at
the end, or connects to the scheduler; a `distributed.Client` the caller already holds is used
as it is and left open. `TaskRunner` runs a function over units of work (a source, a tile) as
one task each: retried (a unit lost with its worker is redone elsewhere), followed by a
progress bar on a terminal (or a log line per tenth), the rest cancelled when one fails or on
Ctrl-C, results in unit order.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
    spec: ClusterSpec | None = None, *, client: Client | None = None
) -> Iterator[Client]:
    """A client for `spec`'s Dask cluster (see the module docstring), or `client` itself."""
    if client is not None:
        yield client
        return
    distributed = import_distributed()
    from cluster.dask.section import DaskSpec  # pydantic: only where a cluster is made

    dask = (spec.dask if spec is not None else None) or DaskSpec()
    if dask.embedded:
        workers = spec.workers if spec is not None else 1
        with (
            _quiet_scheduler(),
            distributed.LocalCluster(
                n_workers=workers,
                threads_per_worker=dask.threads_per_worker or 1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster,
            distributed.Client(cluster) as local,
        ):
            yield local
        return
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
        distributed = import_distributed()
        batch = uuid.uuid4().hex[:8]
        scattered = [self.client.scatter([value], hash=False)[0] for value in shared]
        futures = [
            self.client.submit(
                fn, *scattered, unit, retries=self.retries, pure=False, key=f"{what}-{batch}-{i}"
            )
            for i, unit in enumerate(units)
        ]
        try:
            with _Progress(len(futures), what, self.show_progress) as advance:
                for future in distributed.as_completed(futures):
                    if future.status == "error":
                        future.result()  # raises the task's own error
                    advance()
            return [future.result() for future in futures]
        finally:  # failed, interrupted, or done: nothing of this batch keeps running
            self.client.cancel([f for f in futures if not f.done()])


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
