"""One rank's share of a distributed tile run: cut its sources and stage each as a part; on
rank 0, commit every rank's parts in input order while its own share is being cut.

A rank other than 0 publishes each source's chip count as soon as it is cut; once the counts
before a source are known, a thread stages the source as a thin part beside the interior
shard objects it builds itself (`tiling.interior`), so rank 0 moves those objects into the
store instead of building and writing them.

Ranks coordinate only through the staging folder and the store (objects, polled): the same
code runs on one machine, on an NFS-style shared path and on blob storage, and tiling needs
no process group (no torch). The protocol is written down in docs/CONTRACTS.md,
"Distributed tiling".
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tiling.commit import WAIT_LOG_EVERY_S, CommitStats, PendingSource, commit_in_order
from tiling.errors import TilingError
from tiling.fingerprint import Fingerprint
from tiling.interior import split_part
from tiling.params import StoreParams
from tiling.parts import (
    CutSource,
    CutWindow,
    PartStaging,
    SourcePart,
    build_part,
    part_key,
    run_key,
)
from tiling.plan import SourcePlan, TilePlan
from tiling.writer import ChipStoreWriter

logger = logging.getLogger(__name__)

# Rank 0 keeps at most this many of its own parts in memory, uncommitted, for the commit (a
# NAIP quarter-quad's part is ~100-150 MB); when its cutting runs further ahead than that it
# stages them like any rank, and the committer reads them back.
MAX_HELD_PARTS = 2
# A rank other than 0 holds at most this many cut parts waiting for the chip counts before
# them (the next one is staged whole at once).
MAX_WAITING_PARTS = 2
# A rank waiting for the chip counts before its source polls for them this often (doubling).
FIRST_COUNT_POLL_S = 0.02
MAX_COUNT_POLL_S = 0.5
# Once a rank has cut all its sources, how long a part still waiting for the counts before
# it is held before it is staged whole.
COUNT_WAIT_S = 30.0
# Counts read at once by a rank that needs many (each is one small read).
COUNT_READERS = 16


class _StopCuttingError(Exception):
    """Rank 0's committer failed: its own cutting stops between windows."""


@dataclass(frozen=True, slots=True)
class StageItem:
    """A source this rank owns and the key its part must carry."""

    source: SourcePlan
    key: str


def stage_sources(
    items: Sequence[StageItem],
    staging: PartStaging,
    cut: CutSource,
    *,
    num_classes: int,
    done: Callable[[], int] = lambda: 0,
    stop: Callable[[], bool] = lambda: False,
    progress: Callable[[int], None] | None = None,
    keep: Callable[[SourcePart, bool], bool] = lambda part, staged: False,
    ready: Callable[[int], None] = lambda source_id: None,
    reusable: Callable[[SourcePart], bool] = lambda part: True,
    counted: Callable[[int, int], None] = lambda source_id, chips: None,
) -> int:
    """Cut a part for each of `items` that is neither committed nor staged; parts cut.

    `done()` is the committed input-order prefix (asked before each source, so a rank that
    starts late does not cut what rank 0 has already committed from staged parts). A part
    already staged under the expected name is reused only when it checks out whole and
    `reusable(part)` says so. Each part is offered to `keep(part, staged)` (rank 0 holds some
    of its own in memory, the others stage theirs on a thread): a cut part it does not keep
    is staged here. `counted(source_id, chips)` is told each part's chips as soon as it is
    cut or reused, and `ready(source_id)` when it is staged, reused or kept.
    """
    cut_parts = 0
    for item in items:
        source = item.source
        if source.id < done():
            logger.debug("%s: committed already, skipped", source.image.path)
            continue
        reused = staging.get(source.id, item.key)
        if reused is not None and reusable(reused):
            logger.info("%s: reusing its staged part", source.image.path)
            counted(source.id, reused.num_chips)
            keep(reused, True)  # rank 0 may hold it: its commit need not read it a second time
            ready(source.id)
            if progress is not None:
                progress(source.grid.num_chips)
            continue

        def windows(source: SourcePlan = source) -> Iterator[CutWindow]:
            for window in cut(source):
                if stop():
                    raise _StopCuttingError
                yield window

        part = build_part(source.id, item.key, num_classes, windows(), progress)
        cut_parts += 1
        counted(source.id, part.num_chips)
        if not keep(part, False):
            staging.put(part)
            logger.debug("%s: staged %d chips", source.image.path, part.num_chips)
        ready(source.id)
    return cut_parts


class _OwnParts:
    """Rank 0's own parts, handed from its cutting thread to its committing thread.

    The cutting thread keeps a part in memory while fewer than MAX_HELD_PARTS wait (no
    staging: rank 0 is the store's writer, so its own chips need not travel through the
    staging folder), stages it otherwise, and reports each source ready; the committer
    blocks on `take` until its turn's source is ready (no polling), or the cutting failed.
    """

    def __init__(self, staging: PartStaging) -> None:
        self._staging = staging
        self._changed = threading.Condition()
        self._held: dict[int, SourcePart] = {}
        self._ready: set[int] = set()
        self._failure: BaseException | None = None

    def keep(self, part: SourcePart, staged: bool = False) -> bool:
        with self._changed:
            if len(self._held) >= MAX_HELD_PARTS:
                return False
            self._held[part.source_id] = part
            return True

    def ready(self, source_id: int) -> None:
        with self._changed:
            self._ready.add(source_id)
            self._changed.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._changed:
            self._failure = exc
            self._changed.notify_all()

    def check(self) -> None:
        """Raise the cutting thread's failure, if any."""
        with self._changed:
            if self._failure is not None:
                raise self._failure

    def take(self, item: PendingSource) -> tuple[SourcePart, float]:
        """The part of `item` (an own source), from memory, else read back from staging; and
        the seconds that read took."""
        with self._changed:
            self._changed.wait_for(
                lambda: item.record.id in self._ready or self._failure is not None
            )
            if self._failure is not None:
                raise self._failure
            held = self._held.pop(item.record.id, None)
        if held is not None:
            return held, 0.0
        start = time.perf_counter()
        part = self._staging.get(item.record.id, item.key)
        if part is None:  # staged and checked a moment ago: the staging folder was tampered with
            raise TilingError(
                f"{self._staging.url}: the part of source {item.record.id} rank 0 staged is "
                "gone or damaged; rerun the command (it resumes)"
            )
        return part, time.perf_counter() - start


class _Starts:
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
        None once `give_up()` says so first. `stop()` raises _StopCuttingError."""
        delay, start = FIRST_COUNT_POLL_S, time.perf_counter()
        logged = start
        while True:
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
            if stop():
                raise _StopCuttingError
            if give_up():
                return None
            now = time.perf_counter()
            if now - logged >= WAIT_LOG_EVERY_S:
                logger.info(
                    "waiting %.0f s for the chip counts of sources before %d",
                    now - start,
                    source_id,
                )
                logged = now
            time.sleep(delay)
            delay = min(MAX_COUNT_POLL_S, delay * 2)


class _Stager:
    """A rank's cut parts, staged on a thread as soon as the chips before each are counted:
    thin, beside the interior shard objects it builds, or whole when no shard object lies
    inside the source.

    The cutting never waits on the other ranks: while MAX_WAITING_PARTS parts wait for their
    counts, the next one is staged whole at once. Once the cutting is done, the parts still
    waiting get COUNT_WAIT_S more, then are staged whole (a rank 0 that is late or dead
    does not hold the others; the store's bytes are the same either way).
    """

    def __init__(self, staging: PartStaging, starts: _Starts, params: StoreParams) -> None:
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
        except _StopCuttingError:
            pass
        except BaseException as exc:  # raised in the cutting thread
            self._failure = exc


def stage_and_commit(
    writer: ChipStoreWriter,
    pending: Sequence[PendingSource],
    own: Sequence[StageItem],
    staging: PartStaging,
    cut: CutSource,
    params: StoreParams,
    *,
    num_classes: int,
    recut: Callable[[PendingSource], SourcePart],
    progress: Callable[[int], None] | None = None,
) -> tuple[CommitStats, int]:
    """Rank 0: cut `own` on a thread while committing `pending` here, in input order.

    Rank 0's own parts go from the cutting thread to the commit in memory (staged only
    when the cutting runs MAX_HELD_PARTS ahead); the others' are polled for in the staging
    folder. Returns the commit's cost and the number of parts rank 0 cut.
    """
    own_parts = _OwnParts(staging)
    count_key = run_key(params)
    cut_count: list[int] = []
    stopping = threading.Event()

    def cut_own() -> None:
        try:
            cut_count.append(
                stage_sources(
                    own,
                    staging,
                    cut,
                    num_classes=num_classes,
                    stop=stopping.is_set,
                    keep=own_parts.keep,
                    ready=own_parts.ready,
                    # rank 0 writes its own sources whole: a thin part left for another rank
                    # (an earlier run with other ranks) is cut again
                    reusable=lambda part: part.interior is None,
                    counted=lambda source_id, chips: staging.put_count(source_id, count_key, chips),
                )
            )
        except _StopCuttingError:
            pass
        except BaseException as exc:  # re-raised in the committing thread
            own_parts.fail(exc)

    thread = threading.Thread(target=cut_own, name="tile-rank0-cut", daemon=True)
    thread.start()
    try:
        stats = commit_in_order(
            writer,
            pending,
            staging,
            progress=progress,
            check=own_parts.check,
            own=own_parts.take,
            recut=recut,
        )
    finally:
        stopping.set()
        thread.join()
    own_parts.check()
    return stats, sum(cut_count)


def stage_rank(
    plan: TilePlan,
    mine: Sequence[SourcePlan],
    staging: PartStaging,
    cut: CutSource,
    prints: Mapping[str, Fingerprint],
    *,
    done_chips: Callable[[], list[int]],
    progress: Callable[[int], None] | None = None,
) -> int:
    """A rank other than 0: stage a part for each source it owns; parts cut.

    `done_chips()` gives the chips of the sources the store holds as done (an input-order
    prefix; empty under --overwrite). Each part is staged thin beside its interior shard
    objects once the chips before it are counted; a thin part staged by an earlier run is
    reused only when it was made for the same start row and its objects are still staged.
    """
    items = [StageItem(s, part_key(plan.params, s, prints)) for s in mine]
    starts = _Starts(staging, plan.params, done_chips)

    def reusable(part: SourcePart) -> bool:
        inner = part.interior
        if inner is None:
            return True
        if inner.shard_size != plan.params.shard_size or not staging.has_interior(part):
            return False
        deadline = time.monotonic() + COUNT_WAIT_S
        return inner.start == starts.wait(
            part.source_id, give_up=lambda: time.monotonic() > deadline
        )

    stager = _Stager(staging, starts, plan.params)
    try:
        cut_parts = stage_sources(
            items,
            staging,
            cut,
            num_classes=plan.num_classes,
            done=lambda: len(done_chips()),
            progress=progress,
            keep=stager.keep,
            reusable=reusable,
            counted=starts.publish,
        )
    except BaseException:
        stager.close(abort=True)
        raise
    stager.close()
    return cut_parts


def commit_ranks(
    writer: ChipStoreWriter,
    plan: TilePlan,
    todo: Sequence[SourcePlan],
    owners: Sequence[int],
    staging: PartStaging,
    cut: CutSource,
    prints: Mapping[str, Fingerprint],
    *,
    progress: Callable[[int], None] | None = None,
) -> tuple[CommitStats, int]:
    """Rank 0 of several: commit `todo` in input order, cutting and staging its own share."""
    keys = {s.id: part_key(plan.params, s, prints) for s in todo}
    pending = [
        PendingSource(
            s.record(prints.get(s.image.path)), keys[s.id], owners[s.id], s.grid.num_chips
        )
        for s in todo
    ]
    own = [StageItem(s, keys[s.id]) for s in todo if owners[s.id] == 0]
    sources = {s.id: s for s in todo}

    def recut(item: PendingSource) -> SourcePart:
        return build_part(item.record.id, item.key, plan.num_classes, cut(sources[item.record.id]))

    stats, staged = stage_and_commit(
        writer,
        pending,
        own,
        staging,
        cut,
        plan.params,
        num_classes=plan.num_classes,
        recut=recut,
        progress=progress,
    )
    logger.info(
        "%s: committed %d parts, %.1f MB in %.2f s (%.0f MB/s), %d interior objects moved in",
        writer.url,
        stats.parts,
        stats.bytes / 1e6,
        stats.seconds,
        stats.mb_per_s,
        stats.moved,
    )
    return stats, staged
