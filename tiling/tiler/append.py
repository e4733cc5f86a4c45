"""Tile's commit role: rank 0 (or the one process of a run) creates or resumes the store,
appends every source not yet in it in input order, and finishes it.

A one-process run appends the windows its `tiling.tiler.cut.Cutter` cuts, strictly in input order,
while zarr compresses shards on its own thread pool, so the store is byte for byte the same
for any number of workers; it appends instead the parts an interrupted distributed run staged
(`tiling.tiler.commit.write_sources`), and with a task scheduler (`run_units`) it first has every
source cut and staged as a unit of work there (`tiling.tiler.units`,
`tiling.tiler.cut.stage_source`). Rank 0 of several commits every rank's staged parts in input order
while it cuts the sources it owns (`tiling.tiler.ranks.commit_ranks`). The staging folder is removed
after the store's commit point: a crash between the two leaves only garbage. docs/CONTRACTS.md,
"Distributed tiling", has the protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tiling.chipstore.resume import check_done_sources, open_writer
from tiling.chipstore.store import StoreSummary
from tiling.chipstore.writer import ChipStoreWriter
from tiling.tiler.commit import CommitStats, reusable_parts, write_sources
from tiling.tiler.cut import Cutter, stage_source
from tiling.tiler.rankplan import RankPlan
from tiling.tiler.ranks import commit_ranks
from tiling.tiler.units import UnitRunner

__all__ = ["Appended", "append_sources"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Appended:
    """What the commit role did to the store."""

    summary: StoreSummary  # of the finished store
    sources_written: int  # appended by this run
    sources_resumed: int  # already done in the store and skipped
    chips_written: int
    parts_cut: int = 0  # rank 0 of several: the sources it cut into parts
    commit: CommitStats = field(default_factory=CommitStats)  # rank 0 of several: its cost


def append_sources(
    work: RankPlan,
    cutter: Cutter,
    *,
    run_units: UnitRunner | None = None,
    progress: Callable[[int], None] | None = None,
) -> Appended:
    """Rank 0: write (or resume) the store of `work`, cutting with `cutter` what no part
    holds, and finish it. `progress(n)`: numbers of candidate chips done (done sources at
    once; then after each window in one process, after each committed source with ranks)."""
    config, plan = work.config, work.plan
    staging = work.staging()
    writer = _open_writer(work, progress)
    done_ids = writer.done_source_ids
    todo = [s for s in plan.sources if s.id not in done_ids]
    chips_before = writer.num_chips
    stats, staged, used_staging = CommitStats(), 0, True
    if work.world_size == 1:
        if run_units is not None and todo:
            run_units(stage_source, [s.id for s in todo], shared=(config, plan), what="sources")
        names = staging.names()  # one listing: parts an interrupted run of ranks left
        used_staging = bool(names)
        reuse = reusable_parts(names, plan, todo, work.prints)
        windows = cutter.windows([s for s in todo if s.id not in reuse])
        try:
            write_sources(
                writer, plan, todo, windows, cutter.source, staging, reuse, work.prints, progress
            )
        finally:
            windows.close()  # on failure: cancel the windows not started yet
    else:
        stats, staged = commit_ranks(
            writer,
            plan,
            todo,
            work.owners,
            staging,
            cutter.source,
            work.prints,
            progress=progress,
        )
    summary = writer.finish()
    if used_staging:
        staging.remove()  # after the commit point: a crash between the two leaves only garbage
    return Appended(
        summary=summary,
        sources_written=len(todo),
        sources_resumed=len(done_ids),
        chips_written=summary.num_chips - chips_before,
        parts_cut=staged,
        commit=stats,
    )


def _open_writer(work: RankPlan, progress: Callable[[int], None] | None) -> ChipStoreWriter:
    """Create or resume the store; count its done sources as progress."""
    config, plan = work.config, work.plan
    writer = open_writer(
        config.out,
        plan.params,
        storage_options=config.storage_options,
        overwrite=config.overwrite,
        fingerprints=work.prints,
    )
    check_done_sources(writer, {s.id: s.image.path for s in plan.sources})
    done = writer.done_source_ids
    if done:
        logger.info(
            "resuming %s: %d of %d sources already done", config.out, len(done), len(plan.sources)
        )
    if progress is not None:
        skipped = sum(s.grid.num_chips for s in plan.sources if s.id in done)
        if skipped:
            progress(skipped)
    return writer
