"""Appending sources to the store in input order: which rank cuts which source, rank 0
committing the staged parts of a distributed run, and the one-process writer loop (which
appends parts an interrupted distributed run left instead of cutting those sources again).

Ownership is a function of the plan alone (`assign_sources`), so every rank agrees on it
without talking to the others, whatever state of the store each one saw when it started.
Rank 0 is the store's only writer: it takes the parts in input order as they appear in the
staging folder (polled) and hands their chunks, unchanged, to `ChipStoreWriter`, which
builds and writes each shard object whole. The appended chips, their order and their
encoding are those of a one-process run, so the store is too, byte for byte.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiling.chipstore.records import SourceRecord
from tiling.chipstore.store_format import ATTRS_KEY, FORMAT_NAME, FORMAT_VERSION, done_chips
from tiling.chipstore.writer import ChipStoreWriter
from tiling.errors import StoreError, TilingError
from tiling.runtime.fingerprint import Fingerprint
from tiling.runtime.urls import filesystem, is_local, local_path, storage_errors
from tiling.staged import PollSchedule, wait_until
from tiling.tiler.parts import (
    CutSource,
    CutWindow,
    SourcePart,
    SourceTotals,
    build_part,
    part_key,
)
from tiling.tiler.plan import SourcePlan, TilePlan
from tiling.tiler.staging import PartStaging

logger = logging.getLogger(__name__)

# How rank 0 polls for another rank's part: on blob storage at most one small request per
# second per waiting rank 0.
PART_POLL = PollSchedule(first_s=0.05, max_s=1.0)
# Rank 0 counts each chip it commits as this fraction of one it cuts. Measured with
# benchmarks/bench_tile_ranks.py (2048 chips of 256 px on local disk) the commit takes
# 1.2-1.8 s against ~9.5 s of cutting, but waits on the disk part of that time: weights of
# 0, 0.1 and 0.2 were within the run-to-run spread at 2 ranks. 0.1 keeps rank 0 cutting at a
# few ranks, and from 11 on it cuts only the first source and commits.
COMMIT_WEIGHT = 0.1


def check_rank(rank: int, world_size: int) -> None:
    """Refuse a rank outside [0, world_size) with one line."""
    if world_size < 1:
        raise TilingError(f"world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise TilingError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")


def assign_sources(
    planned_chips: Sequence[int], world_size: int, *, commit_weight: float = COMMIT_WEIGHT
) -> list[int]:
    """The rank that cuts each source, in input order.

    Each source goes to the rank with the least work so far (ties: the lowest rank), where
    a rank's work is the planned chips it cuts and, for rank 0, `commit_weight` times every
    chip dealt so far (it commits them all). Loads differ by about one source's chips, and
    because sources are dealt in input order every rank works near the front of the queue
    the committer drains: rank 0 finds parts in the order it needs them. The last source
    never goes to rank 0 while another rank cuts any (it swaps with that rank's last one):
    rank 0 commits it once everything is cut, and another rank's part is committed by
    moving the shard objects in. With many ranks, rank 0 commits and cuts only the first
    source.
    """
    loads = [0.0] * world_size
    owners = []
    for chips in planned_chips:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners.append(rank)
        loads[rank] += chips
        if world_size > 1:
            loads[0] += commit_weight * chips
    others = [i for i, rank in enumerate(owners) if rank != 0]
    if owners and owners[-1] == 0 and others:
        # The last source is committed after all the cutting, on the run's critical path:
        # another rank's part costs rank 0 a few renames there, its own a whole write.
        owners[-1], owners[others[-1]] = owners[others[-1]], 0
    return owners


def source_owners(plan: TilePlan, world_size: int) -> list[int]:
    """The rank that cuts each of the plan's sources (`assign_sources` by planned chips), as
    every rank of the job, and the CLI sharing a machine's cores among them, works it out."""
    return assign_sources([s.grid.num_chips for s in plan.sources], world_size)


def stored_done_chips(
    url: str, params_sha256: str, storage_options: Mapping[str, Any] | None = None
) -> list[int]:
    """Chips of each source the store at `url` holds as done (an input-order prefix), for
    the params of this digest (`StoreParams.digest()`, computed once by the caller: this is
    polled, and the params hold every input's path).

    Empty when there is no store there, or one of another format version or written with
    other parameters (rank 0 will refuse or rebuild it; a rank that is not the writer must
    not skip work on its word).
    """
    try:
        with storage_errors(url):
            if is_local(url):
                text = (local_path(url) / "zarr.json").read_text()
            else:
                fs, root = filesystem(url, storage_options)
                text = fs.cat_file(f"{root.rstrip('/')}/zarr.json").decode()
    except FileNotFoundError:
        return []
    try:
        meta = json.loads(text).get("attributes", {}).get(ATTRS_KEY, {})
    except ValueError:  # caught mid-replace on a filesystem without atomic rename
        return []
    if not isinstance(meta, Mapping) or meta.get("format") != FORMAT_NAME:
        return []
    if meta.get("version") != FORMAT_VERSION or meta.get("params_sha256") != params_sha256:
        return []
    try:
        return done_chips(meta)
    except StoreError:  # a damaged attribute: rank 0 refuses the store
        return []


def placeable(writer: ChipStoreWriter, part: SourcePart, staging: PartStaging) -> bool:
    """Whether `part` can be appended next: a whole part always; a thin part when its
    interior objects were made for the row the store has reached and are all staged."""
    inner = part.interior
    return inner is None or (
        inner.start == writer.num_chips
        and inner.shard_size == writer.params.shard_size
        and staging.has_interior(part)
    )


def commit_part(
    writer: ChipStoreWriter, record: SourceRecord, part: SourcePart, staging: PartStaging
) -> SourceRecord:
    """Append one staged source to the store and mark it done (no re-encoding). A thin
    part's interior objects are moved into the store between its head and its tail; check
    `placeable` first."""
    writer.begin_source(record)
    inner = part.interior
    rows = part.index_rows()
    if inner is None:
        writer.append_encoded(part.images, part.labels, rows)
    else:
        head = inner.head
        writer.append_encoded(part.images[:head], part.labels[:head], rows[:head])
        try:
            staging.place(part, writer.object_key)
        except FileNotFoundError as exc:
            raise TilingError(
                f"{staging.url}: an interior shard object of source {record.id} went missing "
                "while it was committed; rerun the command (it resumes and cuts it again)"
            ) from exc
        writer.skip_placed(inner.shards, inner.image_chunks, inner.label_chunks)
        writer.append_encoded(part.images[head:], part.labels[head:], rows[head + inner.rows :])
    t = part.totals
    return writer.commit_source(
        band_stats=t.band_stats,
        class_counts=tuple(t.class_counts),
        train_chips=t.train,
        val_chips=t.val,
    )


@dataclass(frozen=True, slots=True)
class PendingSource:
    """A source rank 0 still has to commit: its record, its part's key, who cuts it."""

    record: SourceRecord
    key: str
    owner: int
    candidates: int  # planned chips (what the progress bar counts)


@dataclass(frozen=True, slots=True)
class CommitStats:
    """What the commit cost: parts appended, the encoded bytes it wrote from them, interior
    shard objects it moved in whole, seconds spent appending (reading the part, writing and
    moving shard objects, attributes; waiting left out)."""

    parts: int = 0
    bytes: int = 0
    moved: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def commit_in_order(
    writer: ChipStoreWriter,
    pending: Sequence[PendingSource],
    staging: PartStaging,
    *,
    progress: Callable[[int], None] | None = None,
    check: Callable[[], None] = lambda: None,
    own: Callable[[PendingSource], tuple[SourcePart, float]] | None = None,
    recut: Callable[[PendingSource], SourcePart] | None = None,
) -> CommitStats:
    """Commit `pending` in order, waiting for each part to be staged and complete.

    `check()` is called while waiting and raises to abandon the wait (rank 0's own cutting
    failed). `own(item)` gives the part of a source this process cuts itself (owner 0),
    waiting for it, and the seconds its read took; the others' parts are polled for in
    `staging`. A staged part under the expected name that fails its checks is left for its
    owner to redo: the wait goes on, it is never appended. A thin part that does not fit the
    row the store has reached is cut again here by `recut(item)` (without it: TilingError).
    """
    stats = CommitStats()
    for item in pending:
        if own is not None and item.owner == 0:
            part, read_s = own(item)
        else:
            part, read_s = _wait_for_part(staging, item, check)
        if not placeable(writer, part, staging):
            if recut is None:
                raise TilingError(
                    f"{staging.url}: the part of source {item.record.id} was made for row "
                    f"{part.interior.start if part.interior else 0}, the store is at row "
                    f"{writer.num_chips}, or its interior objects are gone; rerun the command "
                    "(it resumes and cuts that source again)"
                )
            # made from counts an earlier run left (its inputs changed since): never placed
            logger.warning(
                "%s: the part of source %d does not fit row %d (made for row %d, or its "
                "interior objects are gone); cutting it here",
                staging.url,
                item.record.id,
                writer.num_chips,
                part.interior.start if part.interior else 0,
            )
            start = time.perf_counter()
            part = recut(item)
            read_s += time.perf_counter() - start
        start = time.perf_counter()
        commit_part(writer, item.record, part, staging)
        stats = CommitStats(
            parts=stats.parts + 1,
            bytes=stats.bytes + part.nbytes(),
            moved=stats.moved + len(staging.interior_objects(part)),
            seconds=stats.seconds + read_s + time.perf_counter() - start,
        )
        if progress is not None:
            progress(item.candidates)
    return stats


def _wait_for_part(
    staging: PartStaging, item: PendingSource, check: Callable[[], None]
) -> tuple[SourcePart, float]:
    """Poll until the part of `item` is staged and checks out: (the part, seconds its read took)."""
    read_s = 0.0

    def find() -> SourcePart | None:
        nonlocal read_s
        before = time.perf_counter()
        part = staging.get(item.record.id, item.key)
        read_s = time.perf_counter() - before
        return part

    def waiting(seconds: float) -> None:
        logger.info(
            "waiting %.0f s for the part of source %d (%s) from rank %d",
            seconds,
            item.record.id,
            item.record.path,
            item.owner,
        )

    part = wait_until(find, url=staging.url, schedule=PART_POLL, check=check, waiting=waiting)
    return part, read_s


def reusable_parts(
    staged: frozenset[str],
    plan: TilePlan,
    todo: Sequence[SourcePlan],
    prints: Mapping[str, Fingerprint],
) -> dict[int, str]:
    """Source id → part key, for the sources of `todo` staged under their expected name."""
    if not staged:
        return {}
    keys = {s.id: part_key(plan.params, s, prints) for s in todo}
    return {i: key for i, key in keys.items() if PartStaging.name(i, key) in staged}


def write_sources(
    writer: ChipStoreWriter,
    plan: TilePlan,
    todo: Sequence[SourcePlan],
    windows: Iterator[CutWindow],
    cut: CutSource,
    staging: PartStaging,
    reuse: Mapping[int, str],
    prints: Mapping[str, Fingerprint],
    progress: Callable[[int], None] | None = None,
) -> None:
    """The single writer of a one-process run: append each source's cut `windows` in order,
    then commit the source. A source in `reuse` (id → key) is appended from its staged part
    instead, or, if that part does not check out, cut here by `cut` after all."""
    for source in todo:
        record = source.record(prints.get(source.image.path))
        if source.id in reuse:
            key = reuse[source.id]
            part = staging.get(source.id, key)
            if part is None or not placeable(writer, part, staging):
                part = build_part(source.id, key, plan.num_classes, cut(source))
            commit_part(writer, record, part, staging)
            if progress is not None:
                progress(source.grid.num_chips)
            continue
        writer.begin_source(record)
        totals = SourceTotals(plan.num_classes)
        for _ in source.windows:
            chips = next(windows)
            writer.append_encoded(chips.images, chips.labels, chips.index)
            totals.add(chips)
            if progress is not None:
                progress(chips.candidates)
        committed = writer.commit_source(
            band_stats=totals.band_stats,
            class_counts=tuple(totals.class_counts),
            train_chips=totals.train,
            val_chips=totals.val,
        )
        logger.debug("%s: %d chips (%d val)", source.image.path, committed.chips, totals.val)
