"""One rank's share of a distributed tile run: cut its sources and stage each as a part; on
rank 0, commit every rank's parts in input order while its own share is being cut.

A rank other than 0 hands each cut part to its stager (`tiling.tiler.stager`), which stages it
thin beside the interior shard objects it builds once the counts before it are known, so rank
0 moves those objects into the store instead of building and writing them.

Ranks coordinate only through the staging folder and the store (objects, polled): the same
code runs on one machine, on an NFS-style shared path and on blob storage, and tiling needs
no process group (no torch): the staged-parts protocol (`tiling.staged`), written down in
docs/CONTRACTS.md, "Staged parts" and "Distributed tiling".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tiling.chipstore.params import StoreParams
from tiling.chipstore.writer import ChipStoreWriter
from tiling.errors import TilingError
from tiling.runtime.fingerprint import Fingerprint
from tiling.tiler import stager as stager_module
from tiling.tiler.commit import CommitStats, PendingSource, commit_in_order
from tiling.tiler.parts import CutSource, CutWindow, SourcePart, build_part, part_key
from tiling.tiler.plan import SourcePlan, TilePlan
from tiling.tiler.stager import Stager, Starts, StopCuttingError
from tiling.tiler.staging import PartStaging

logger = logging.getLogger(__name__)

# Rank 0 keeps at most this many of its own parts in memory, uncommitted, for the commit (a
# NAIP quarter-quad's part is ~100-150 MB); when its cutting runs further ahead than that it
# stages them like any rank, and the committer reads them back.
MAX_HELD_PARTS = 2


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
                    raise StopCuttingError
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
    counts = Starts(staging, params, done_chips=list)  # rank 0 only publishes
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
                    counted=counts.publish,
                )
            )
        except StopCuttingError:
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
    starts = Starts(staging, plan.params, done_chips)

    def reusable(part: SourcePart) -> bool:
        inner = part.interior
        if inner is None:
            return True
        if inner.shard_size != plan.params.shard_size or not staging.has_interior(part):
            return False
        deadline = time.monotonic() + stager_module.COUNT_WAIT_S
        return inner.start == starts.wait(
            part.source_id, give_up=lambda: time.monotonic() > deadline
        )

    stager = Stager(staging, starts, plan.params)
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
