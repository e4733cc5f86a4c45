"""Orchestration: sources → chip grid → chip store, in parallel, resumable, deterministic.

`tile` composes tile's three roles, each a function an engine may also call on its own:

- plan (`tiling.tiler.rankplan.plan_rank`): check every input once at the boundary (files, bands,
  dtype, CRS, label footprints, chip size) and decide the split without reading pixels
  (`tiling.tiler.plan`); with several ranks rank 0 publishes the plan and the others load it
  (`tiling.tiler.planfile`); every rank works out which sources it cuts.
- cut (`tiling.tiler.cut`): K worker threads read, align and cut windows, handed on strictly in
  input order; a rank other than 0 stages each of its sources as a part beside the store
  (`tiling.tiler.cut.stage_owned`); a task scheduler runs `tiling.tiler.cut.stage_source` per
  source.
- commit (`tiling.tiler.append.append_sources`): rank 0 alone writes the store, appending the
  windows it cuts or the parts staged, in input order, and finishes it.

The store is therefore byte-for-byte the same for any number of workers, ranks or tasks, and
an interrupted run resumes where the store stops. docs/CONTRACTS.md, "Distributed tiling",
has the protocol of ranks. A one-process run reuses the parts an interrupted distributed run
staged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field

from tiling.chipstore.store import StoreSummary
from tiling.errors import StoreError
from tiling.tiler.append import append_sources
from tiling.tiler.commit import CommitStats
from tiling.tiler.config import TileConfig
from tiling.tiler.cut import Cutter, stage_owned
from tiling.tiler.plan import (
    MAX_WINDOW_WIDTH_PX,
    MIN_WINDOW_HEIGHT_PX,
    SourcePlan,
    TilePlan,
    plan_tiling,
)
from tiling.tiler.rankplan import plan_rank
from tiling.tiler.units import UnitRunner

__all__ = [
    "MAX_WINDOW_WIDTH_PX",
    "MIN_WINDOW_HEIGHT_PX",
    "SourcePlan",
    "TileConfig",
    "TilePlan",
    "TileResult",
    "plan_tiling",
    "tile",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TileResult:
    url: str
    store_summary: StoreSummary | None  # None on ranks other than 0 (rank 0 writes the store)
    sources_written: int  # cut by this process (rank 0 of several: committed)
    sources_resumed: int  # already done in the store and skipped
    chips_written: int
    elapsed_s: float
    workers: int
    rank: int = 0
    world_size: int = 1
    parts_cut: int = 0  # sources this rank cut into parts (distributed runs)
    commit: CommitStats = field(default_factory=CommitStats)  # rank 0 of several: its cost

    @property
    def summary(self) -> StoreSummary:
        """The finished store's summary (rank 0, or a one-process run)."""
        if self.store_summary is None:
            raise StoreError(
                f"{self.url}: rank {self.rank} of {self.world_size} staged its parts; "
                "rank 0 holds the store's summary"
            )
        return self.store_summary


def tile(
    config: TileConfig,
    *,
    plan: TilePlan | None = None,
    progress: Callable[[int], None] | None = None,
    rank: int = 0,
    world_size: int = 1,
    run_units: UnitRunner | None = None,
) -> TileResult:
    """Write (or resume) the chip store described by `config`.

    `progress(n)` is called with numbers of candidate chips done: after each read window in a
    one-process run and on ranks > 0; on rank 0 of several, after each committed source.
    With `world_size` > 1 every rank calls this with the same config; rank 0 returns once the
    store is complete, the others once their parts are staged (no summary). `run_units` (one
    process): each source not yet in the store is first cut and staged as a unit of work
    there (`tiling.tiler.units`: tasks on a Dask cluster), then appended here from its part.
    """
    start = time.perf_counter()
    work = plan_rank(config, plan=plan, rank=rank, world_size=world_size)
    with closing(Cutter(work.plan, config.storage_options, work.workers)) as cutter:
        if rank > 0:
            staged = stage_owned(work, cutter, progress=progress)
            return TileResult(
                url=config.out,
                store_summary=None,
                sources_written=staged,
                sources_resumed=len(work.mine) - staged,
                chips_written=0,
                elapsed_s=time.perf_counter() - start,
                workers=work.workers,
                rank=rank,
                world_size=world_size,
                parts_cut=staged,
            )
        appended = append_sources(work, cutter, run_units=run_units, progress=progress)
    elapsed = time.perf_counter() - start
    logger.info(
        "%s: %d chips from %d sources in %.1f s",
        config.out,
        appended.summary.num_chips,
        len(work.plan.sources),
        elapsed,
    )
    return TileResult(
        url=config.out,
        store_summary=appended.summary,
        sources_written=appended.sources_written,
        sources_resumed=appended.sources_resumed,
        chips_written=appended.chips_written,
        elapsed_s=elapsed,
        workers=work.workers,
        rank=rank,
        world_size=world_size,
        parts_cut=appended.parts_cut,
        commit=appended.commit,
    )
