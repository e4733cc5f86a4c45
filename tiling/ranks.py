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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tiling.commit import CommitStats, PendingSource, commit_in_order
from tiling.fingerprint import Fingerprint
from tiling.parts import CutSource, CutWindow, PartStaging, SourcePart, build_part, part_key
from tiling.plan import SourcePlan, TilePlan
from tiling.writer import ChipStoreWriter

logger = logging.getLogger(__name__)

# Rank 0 keeps at most this many of its own staged parts in memory for the commit (a NAIP
# quarter-quad's part is ~100-150 MB); the others are read back from the staging folder.
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
    staged: Callable[[SourcePart], None] = lambda part: None,
) -> int:
    """Stage a part for each of `items` that is neither committed nor staged; parts written.

    `done()` is the committed input-order prefix (asked before each source, so a rank that
    starts late does not cut what rank 0 has already committed from staged parts). A part
    already staged under the expected name is reused only when it checks out whole.
    `staged(part)` is told of each part this call wrote.
    """
    written = 0
    for item in items:
        source = item.source
        if source.id < done():
            logger.debug("%s: committed already, skipped", source.image.path)
            continue
        if staging.get(source.id, item.key) is not None:
            logger.info("%s: reusing its staged part", source.image.path)
            if progress is not None:
                progress(source.grid.num_chips)
            continue

        def windows(source: SourcePlan = source) -> Iterator[CutWindow]:
            for window in cut(source):
                if stop():
                    raise _StopCuttingError
                yield window

        part = build_part(source.id, item.key, num_classes, windows(), progress)
        staging.put(part)
        staged(part)
        written += 1
        logger.debug("%s: staged %d chips", source.image.path, part.num_chips)
    return written


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
    """Rank 0: cut and stage `own` on a thread while committing `pending` here, in order.

    Rank 0 stages its own sources too (rather than appending them directly) so that a crash
    of rank 0 loses no finished work and a rerun at any world size finds every part in one
    place. Returns the commit's cost and the number of parts rank 0 wrote.
    """
    failure: list[BaseException] = []
    written: list[int] = []
    stopping = threading.Event()
    held: dict[int, SourcePart] = {}  # own parts not committed yet, kept to skip a re-read
    lock = threading.Lock()

    def hold(part: SourcePart) -> None:
        with lock:
            if len(held) < MAX_HELD_PARTS:
                held[part.source_id] = part

    def take(source_id: int) -> SourcePart | None:
        with lock:
            return held.pop(source_id, None)

    def cut_own() -> None:
        try:
            written.append(
                stage_sources(
                    own, staging, cut, num_classes=num_classes, stop=stopping.is_set, staged=hold
                )
            )
        except _StopCuttingError:
            pass
        except BaseException as exc:  # re-raised in the committing thread
            failure.append(exc)

    def check() -> None:
        if failure:
            raise failure[0]

    thread = threading.Thread(target=cut_own, name="tile-rank0-cut", daemon=True)
    thread.start()
    try:
        stats = commit_in_order(
            writer, pending, staging, progress=progress, check=check, in_memory=take
        )
    finally:
        stopping.set()
        thread.join()
    check()
    return stats, sum(written)


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
