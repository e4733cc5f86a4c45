"""One rank's share of a distributed tile run: cut its sources and stage each as a part; on
rank 0, commit every rank's parts in input order while its own share is being cut.

Ranks coordinate only through the staging folder and the store (objects, polled): the same
code runs on one machine, on an NFS-style shared path and on blob storage, and tiling needs
no process group (no torch). The protocol is written down in docs/CONTRACTS.md,
"Distributed tiling".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tiling.commit import CommitStats, PendingSource, commit_in_order
from tiling.errors import TilingError
from tiling.fingerprint import Fingerprint
from tiling.parts import CutSource, CutWindow, PartStaging, SourcePart, build_part, part_key
from tiling.plan import SourcePlan, TilePlan
from tiling.writer import ChipStoreWriter

logger = logging.getLogger(__name__)

# Rank 0 keeps at most this many of its own parts in memory, uncommitted, for the commit (a
# NAIP quarter-quad's part is ~100-150 MB); when its cutting runs further ahead than that it
# stages them like any rank, and the committer reads them back.
MAX_HELD_PARTS = 2


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
    keep: Callable[[SourcePart], bool] = lambda part: False,
    ready: Callable[[int], None] = lambda source_id: None,
) -> int:
    """Cut a part for each of `items` that is neither committed nor staged; parts cut.

    `done()` is the committed input-order prefix (asked before each source, so a rank that
    starts late does not cut what rank 0 has already committed from staged parts). A part
    already staged under the expected name is reused only when it checks out whole. Each
    part cut is offered to `keep` (rank 0 holds some of its own in memory) and staged when
    it is not kept, each reused one is offered too; `ready(source_id)` is told when a
    source's part is staged, reused or kept.
    """
    cut_parts = 0
    for item in items:
        source = item.source
        if source.id < done():
            logger.debug("%s: committed already, skipped", source.image.path)
            continue
        reused = staging.get(source.id, item.key)
        if reused is not None:
            logger.info("%s: reusing its staged part", source.image.path)
            keep(reused)  # rank 0 may hold it: its commit need not read it a second time
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
        if not keep(part):
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

    def keep(self, part: SourcePart) -> bool:
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
    *,
    num_classes: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[CommitStats, int]:
    """Rank 0: cut `own` on a thread while committing `pending` here, in input order.

    Rank 0's own parts go from the cutting thread to the commit in memory (staged only
    when the cutting runs MAX_HELD_PARTS ahead); the others' are polled for in the staging
    folder. Returns the commit's cost and the number of parts rank 0 cut.
    """
    own_parts = _OwnParts(staging)
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
            writer, pending, staging, progress=progress, check=own_parts.check, own=own_parts.take
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
    done: Callable[[], int],
    progress: Callable[[int], None] | None = None,
) -> int:
    """A rank other than 0: stage a part for each source it owns; parts written."""
    items = [StageItem(s, part_key(plan.params, s, prints)) for s in mine]
    return stage_sources(
        items, staging, cut, num_classes=plan.num_classes, done=done, progress=progress
    )


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
    stats, staged = stage_and_commit(
        writer, pending, own, staging, cut, num_classes=plan.num_classes, progress=progress
    )
    logger.info(
        "%s: committed %d parts, %.1f MB in %.2f s (%.0f MB/s)",
        writer.url,
        stats.parts,
        stats.bytes / 1e6,
        stats.seconds,
        stats.mb_per_s,
    )
    return stats, staged
