"""What one process does with a stage at its place in the job: the whole stage in one
process, one rank's share of it, or the stage with its units as tasks (`run_units`).

Every executor of `landcover.stagerun` ends here: the in-process run, each rank an engine
starts (`landcover stage-rank URL`, after reading the published stage) and the process that
hands units to a task engine. A stage's result is the same whichever runs it: each rank and
task computes a pure function of the stage and its unit, and rank 0 (or the one process)
commits. Rank 0 alone returns the lines the command ends with (`StageOutcome.lines`); the
other ranks return none. No click here: the caller prints the lines.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from landcover.distenv import pooled_share
from landcover.stageconfig import PredictStage, Stage, TileStage
from tiling.runtime.rankenv import DistEnv

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig
    from landcover.prediction.outgrid import OutputGrid
    from tiling.chipstore.store import StoreSummary
    from tiling.tiler.tile import TilePlan
    from tiling.tiler.units import UnitRunner

logger = logging.getLogger(__name__)

# A progress bar over a number of units (tile: candidate chips): a context holding the
# callback that advances it, or None.
ProgressBar = Callable[[int], AbstractContextManager[Callable[[int], None] | None]]


@dataclass(frozen=True, slots=True)
class StageOutcome:
    """What running a stage gave this process: the lines the command ends with (rank 0's or
    the one process's; none on the other ranks) and the library's result, where this process
    has one (a rank job's launcher has none)."""

    lines: tuple[str, ...] = ()
    result: Any = None


def run_here(
    stage: Stage,
    *,
    dist: DistEnv | None = None,
    run_units: UnitRunner | None = None,
    progress_bar: ProgressBar | None = None,
    say: Callable[[str], None] | None = None,
) -> StageOutcome:
    """Run `stage` in this process as rank `dist` of its job (default: the only one), its
    units as tasks of `run_units` when given. `say` is given each of the lines the command
    ends with as soon as it is known (the outcome holds them too)."""
    dist = dist or DistEnv()
    lines = _Lines(say)
    if isinstance(stage, TileStage):
        result = _tile(stage, dist, run_units, progress_bar, lines)
    else:
        result = _predict(stage, dist, run_units, lines)
    return StageOutcome(tuple(lines.said), result)


class _Lines:
    """The lines a stage ends with, each passed on to `say` as it is added."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.said: list[str] = []
        self._say = say

    def __call__(self, line: str) -> None:
        self.said.append(line)
        if self._say is not None:
            self._say(line)


def run_as_rank(stage: Stage, *, rank: int, world_size: int, local_ranks: range) -> StageOutcome:
    """`run_here` as rank `rank` of `world_size`, in the shape a task engine calls a rank
    (`cluster.tasks.TaskEngine.run_ranks`)."""
    dist = DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=rank - local_ranks.start,
        local_world_size=len(local_ranks),
    )
    return run_here(stage, dist=dist)


@contextmanager
def only_rank_0_warns(dist: DistEnv) -> Iterator[None]:
    """Run a stage's planning, in which every rank reads the same inputs and would warn alike,
    with the ranks other than 0 logging errors only: the job warns about its inputs once."""
    if dist.is_main:
        yield
        return
    root = logging.getLogger()
    saved = root.level
    root.setLevel(max(saved, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(saved)


@contextmanager
def imports_kept_out_of_collections() -> Iterator[None]:
    """Import the tiling stack with the cyclic collector paused, then freeze what is alive.

    The modules live as long as the process: frozen, no later full collection (nor the one
    at exit) walks their objects again, and none runs while they are built; together about
    a fifth of the CPU the imports cost. Only when this call imports them (a process's
    first tile), so that a process running many commands freezes its objects once.
    """
    first = "tiling.tiler.tile" not in sys.modules
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if first:
            gc.freeze()
        if enabled:
            gc.enable()


# -- tile ---------------------------------------------------------------------------------


def _tile(
    stage: TileStage,
    dist: DistEnv,
    run_units: UnitRunner | None,
    progress_bar: ProgressBar | None,
    say: _Lines,
) -> Any:
    with imports_kept_out_of_collections():
        from tiling.runtime.machine import cores_per_rank
        from tiling.tiler.planfile import plan_for_rank
        from tiling.tiler.tile import tile

    config = stage.config
    pooled = dist.is_distributed and config.workers is None  # the ranks on a node share cores
    if pooled:
        config = replace(config, workers=cores_per_rank(dist.local_world_size))
    with only_rank_0_warns(dist):
        plan = plan_for_rank(config, rank=dist.rank, world_size=dist.world_size)
    if pooled:  # ranks without sources leave their cores to those with some
        config = replace(config, workers=_pooled_workers(plan, dist, config.effective_workers))
    bar = progress_bar if progress_bar is not None and dist.is_main else None
    with bar(plan.max_chips) if bar is not None else nullcontext() as progress:
        result = tile(
            config,
            plan=plan,
            progress=progress,
            rank=dist.rank,
            world_size=dist.world_size,
            run_units=run_units,
        )
    if dist.is_main:  # rank 0 speaks for the job
        ranks = f"{dist.world_size} ranks x " if dist.is_distributed else ""
        workers = f"{ranks}{result.workers} workers"
        resumed, elapsed_s = result.sources_resumed, result.elapsed_s
        say(tile_summary_line(plan, result.summary, resumed, elapsed_s, workers))
    return result


def _pooled_workers(plan: TilePlan, dist: DistEnv, per_rank: int) -> int:
    """Reader threads for this rank when the ranks of its machine pool their cores: a rank
    that owns no source (more ranks than sources) leaves its share to those that do; rank 0
    always has work (it commits)."""
    from tiling.tiler.commit import source_owners

    owners = set(source_owners(plan, dist.world_size))
    busy = [r for r in dist.local_ranks if r == 0 or r in owners]
    return pooled_share(busy, dist.rank, dist.local_ranks, per_rank)


def tile_summary_line(
    plan: TilePlan, s: StoreSummary, resumed: int, elapsed_s: float, workers: str
) -> str:
    """The line `tile` ends with (one process or rank 0 of a job)."""
    resumed_note = f", {resumed} resumed" if resumed else ""
    return (
        f"wrote {plan.config.out}: {s.num_chips} chips (train {s.num_train}, val {s.num_val}) "
        f"from {len(s.sources)} sources{resumed_note}{skipped_note(plan)} in {elapsed_s:.1f} s "
        f"with {workers}"
    )


def skipped_note(plan: TilePlan) -> str:
    """What a tile summary says of the images too small for a chip ("" when none)."""
    n = len(plan.skipped)
    if not n:
        return ""
    return f" ({n} image{'s' if n > 1 else ''} smaller than --chip-size skipped)"


# -- predict ------------------------------------------------------------------------------


def _predict(stage: PredictStage, dist: DistEnv, run_units: UnitRunner | None, say: _Lines) -> Any:
    from landcover.devices import rank_device
    from landcover.prediction.stacitem import check_stac_item_target

    config = stage.config
    if stage.stac_item is not None:  # fail before the work, not after it
        check_stac_item_target(stage.stac_item, overwrite=config.overwrite)
    if dist.is_distributed:
        config = replace(config, device=rank_device(config.device, dist.local_rank))
    if stage.tiled:
        return _predict_tiled(stage, config, dist, run_units, say)
    from landcover.prediction.runner import predict_region

    # SIGTERM: cli.main's handler lets cleanup run
    result = predict_region(
        config, rank=dist.rank, world_size=dist.world_size, local_ranks=dist.local_ranks
    )
    if not dist.is_main:
        return result  # rank 0 speaks for the job
    read = len(result.sources)
    say(predict_summary_line(result.out, result.grid, result.valid_pixels, read, result.elapsed_s))
    if result.probabilities:
        say(f"wrote {result.probabilities}")
    if stage.stac_item is not None:
        from landcover.prediction.stacitem import write_stac_item

        used = set(result.sources)
        sources = [s for s in stage.stac_sources if s.href in used]
        write_stac_item(stage.stac_item, result.out, sources=sources, overwrite=config.overwrite)
        say(f"wrote {stage.stac_item}")
    if stage.quicklook:
        _write_quicklook(result.out, overwrite=config.overwrite)
    return result


def _predict_tiled(
    stage: PredictStage,
    config: PredictConfig,
    dist: DistEnv,
    run_units: UnitRunner | None,
    say: _Lines,
) -> Any:
    """A tiled product as this rank of the job, or with its tiles as tasks of `run_units`."""
    from landcover.prediction.tiled import predict_product
    from landcover.prediction.tileplan import TiledSetup

    tile_px = config.tile_px
    assert tile_px is not None  # stage.tiled
    result = predict_product(
        TiledSetup(config, tile_px, stage.stac_sources),
        rank=dist.rank,
        world_size=dist.world_size,
        run_units=run_units,
    )
    if not dist.is_main:
        return result
    say(
        f"wrote {result.out}: {result.tiles} tile(s) of {tile_px} px ({result.tiles - result.kept} "
        f"predicted, {result.kept} kept) over {result.grid_width} x "
        f"{result.grid_height} px at {result.resolution:g}, {result.valid_pixels:,} px "
        f"predicted from {len(result.sources)} image(s) in {result.elapsed_s:.1f} s; "
        "collection.json, mosaic.vrt"
    )
    if stage.quicklook:  # the product's own picture: replaced on a rerun
        _write_quicklook(config.out, overwrite=True)
    return result


def _write_quicklook(out: str, *, overwrite: bool) -> None:
    from landcover.view.quicklook import write_quicklook

    logger.info("wrote %s", write_quicklook(out, overwrite=overwrite))


def predict_summary_line(
    out: str, grid: OutputGrid, valid_pixels: int, images: int, elapsed_s: float
) -> str:
    """The line `predict` ends with (one process or rank 0 of a job)."""
    epsg = grid.crs.to_epsg()
    crs_name = f"EPSG:{epsg}" if epsg else grid.crs.to_string()
    return (
        f"wrote {out}: {grid.width} x {grid.height} px at {grid.resolution:g} ({crs_name}), "
        f"{valid_pixels:,} px predicted from {images} image(s) in {elapsed_s:.1f} s"
    )
