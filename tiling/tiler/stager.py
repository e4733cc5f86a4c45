"""A rank's stager: chip counts and thin parts for the ranks other than 0.

Every owner publishes each source's chip count as soon as it is cut (`Starts.publish`); a
source's start row in the store is the sum of the counts before it (`Starts.wait`). A rank
other than 0 hands its cut parts to a `Stager` thread, which stages each one as soon as its
start row is known: thin, beside the interior shard objects it builds (`tiling.tiler.interior`),
or whole when no shard object lies inside it. The protocol is in docs/CONTRACTS.md,
"Staged parts" and "Distributed tiling"; the waits are `tiling.staged.poll`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from tiling.chipstore.params import StoreParams
from tiling.runtime.polling import LOCAL_COUNT_MAX_S
from tiling.staged import PollSchedule, poll
from tiling.tiler.interior import split_part
from tiling.tiler.parts import SourcePart, run_key
from tiling.tiler.staging import PartStaging

logger = logging.getLogger(__name__)

# A rank other than 0 holds at most this many cut parts waiting for the chip counts before
# them (the next one is staged whole at once).
MAX_WAITING_PARTS = 2
# A rank waiting for the chip counts before its source polls for them this often (doubling;
# on a local or mounted path at most every LOCAL_COUNT_MAX_S).
COUNT_POLL = PollSchedule(first_s=0.02, max_s=0.5, local_max_s=LOCAL_COUNT_MAX_S)
# Once a rank has cut all its sources, how long a part still waiting for the counts before
# it is held before it is staged whole.
COUNT_WAIT_S = 30.0
# Counts read at once by a rank that needs many (each is one small read).
COUNT_READERS = 16


class StopCuttingError(Exception):
    """The rank's work is being abandoned (rank 0's committer failed, or the cutting did):
    cutting and waiting stop between steps."""


class Starts:
    """Where each source starts in the store: the sum of the chips of the sources before it,
    the done ones read from the store's records, the others from the counts their owners
    publish in the staging folder (`PartStaging.put_count`)."""

    def __init__(
        self,
        staging: PartStaging,
        params: StoreParams,
        done_chips: Callable[[], list[int]],
    ) -> None:
        self._staging = staging
        self._key = run_key(params)
        self._done_chips = done_chips
        self._known: dict[int, int] = {}
        self._lock = threading.Lock()

    def publish(self, source_id: int, chips: int) -> None:
        """Tell the other ranks how many chips `source_id` keeps."""
        self._staging.put_count(source_id, self._key, chips)
        with self._lock:
            self._known[source_id] = chips

    def _read_counts(self, sources: Sequence[int]) -> dict[int, int | None]:
        """The published counts of `sources`, COUNT_READERS at a time (on blob storage a
        rank whose first source is the 1,000th reads 1,000 counts, each a round trip)."""
        if len(sources) <= 1:
            return {j: self._staging.count(j, self._key) for j in sources}
        with ThreadPoolExecutor(max_workers=COUNT_READERS, thread_name_prefix="counts") as pool:
            counts = pool.map(lambda j: self._staging.count(j, self._key), sources)
            return dict(zip(sources, counts, strict=True))

    def wait(
        self,
        source_id: int,
        stop: Callable[[], bool] = lambda: False,
        give_up: Callable[[], bool] = lambda: False,
    ) -> int | None:
        """The row `source_id` starts at, once the chips of every source before it are known;
        None once `give_up()` says so first. `stop()` raises StopCuttingError."""

        def find() -> int | None:
            with self._lock:
                missing = [j for j in range(source_id) if j not in self._known]
            found = self._read_counts(missing)
            if any(chips is None for chips in found.values()):
                found.update(
                    (j, chips)
                    for j, chips in enumerate(self._done_chips())
                    if j in found and found[j] is None
                )
            with self._lock:
                self._known.update((j, c) for j, c in found.items() if c is not None)
                if all(j in self._known for j in range(source_id)):
                    return sum(self._known[j] for j in range(source_id))
            return None

        def check() -> None:
            if stop():
                raise StopCuttingError

        def waiting(seconds: float) -> None:
            logger.info(
                "waiting %.0f s for the chip counts of sources before %d", seconds, source_id
            )

        return poll(
            find,
            url=self._staging.url,
            schedule=COUNT_POLL,
            check=check,
            give_up=give_up,
            waiting=waiting,
        )


class Stager:
    """A rank's cut parts, staged on a thread as soon as the chips before each are counted:
    thin, beside the interior shard objects it builds, or whole when no shard object lies
    inside the source.

    The cutting never waits on the other ranks: while MAX_WAITING_PARTS parts wait for their
    counts, the next one is staged whole at once. Once the cutting is done, the parts still
    waiting get COUNT_WAIT_S more, then are staged whole (a rank 0 that is late or dead
    does not hold the others; the store's bytes are the same either way).
    """

    def __init__(self, staging: PartStaging, starts: Starts, params: StoreParams) -> None:
        self._staging = staging
        self._starts = starts
        self._params = params
        self._queue: queue.Queue[SourcePart | None] = queue.Queue(maxsize=MAX_WAITING_PARTS)
        self._failure: BaseException | None = None
        self._stopping = threading.Event()
        self._deadline: float | None = None  # set when the cutting is done
        self._thread = threading.Thread(target=self._run, name="tile-stage", daemon=True)
        self._thread.start()

    def keep(self, part: SourcePart, staged: bool) -> bool:
        """Take a cut part over, unless MAX_WAITING_PARTS wait already (a reused one is
        staged already)."""
        if self._failure is not None:
            raise self._failure
        if staged:
            return True
        try:
            self._queue.put_nowait(part)
        except queue.Full:
            return False
        return True

    def close(self, *, abort: bool = False) -> None:
        """Stage what is queued (or, on `abort`, stop) and raise the thread's failure."""
        self._deadline = time.monotonic() + COUNT_WAIT_S
        if abort:
            self._stopping.set()
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        if self._failure is not None and not abort:
            raise self._failure

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _run(self) -> None:
        try:
            while (part := self._queue.get()) is not None:
                start = self._starts.wait(
                    part.source_id, self._stopping.is_set, self._past_deadline
                )
                split = None if start is None else split_part(part, start, self._params)
                if split is None:
                    self._staging.put(part)
                    continue
                thin, objects = split
                self._staging.put_interior(thin, objects)  # before the part: rank 0 waits on it
                self._staging.put(thin)
        except StopCuttingError:
            pass
        except BaseException as exc:  # raised in the cutting thread
            self._failure = exc
