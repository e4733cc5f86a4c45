"""Which part of the output grid each rank of a distributed prediction runs.

The grid's blocks are shared out by whole block ROWS: the runner carries the logits of
windows that reach into the next block of the same row and runs the windows between two
block rows once for each row, so a block row's pixels depend on that row alone and a rank
that runs whole rows writes exactly what one process would. Each rank gets one contiguous
range of rows (one part file, and neighbouring rows read the same images, so each image is
read by one or two ranks rather than by all). The ranges are balanced by the work each row
holds, estimated as the area of the row's strip inside the region (rows outside it cost
nothing), so that the busiest rank has as little as possible: a state-shaped region gives
fewer of its wide rows to a rank than of its narrow tips.

The split is a pure function of the plan, so every rank computes the same one without
talking to the others. It cannot use more ranks than the grid has block rows with work in
them; the others get empty shares (a smaller --block-px gives more rows). On the CPU the
ranks of one machine then pool their threads (`pooled_threads`): a rank without rows leaves
its cores to the ranks of its machine that have rows, so a region of one block row runs on
every core whatever the number of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shapely.geometry import box

from landcover.distenv import pooled_share
from landcover.errors import PredictionError
from landcover.prediction.blend import WindowLayout
from landcover.prediction.gridwindow import Window
from landcover.prediction.outgrid import GridPlan, OutputGrid


@dataclass(frozen=True, slots=True)
class RankShare:
    """The grid rows [row0, row1) (pixels, whole block rows) that `rank` predicts."""

    rank: int
    row0: int
    row1: int

    @property
    def is_empty(self) -> bool:
        return self.row1 <= self.row0

    def window(self, grid: OutputGrid) -> Window:
        """This share's rows of `grid`, every column."""
        return Window(self.row0, 0, max(self.row1 - self.row0, 0), grid.width)

    def blocks(self, grid: OutputGrid, block_px: int) -> list[Window]:
        """This share's blocks, in the one-process order (its rows are whole block rows)."""
        return self.window(grid).blocks(block_px)

    def grid(self, grid: OutputGrid) -> OutputGrid:
        """The grid of this share's rows alone (the grid of its part file)."""
        return grid.sub(self.window(grid))


def whole_grid(grid: OutputGrid) -> RankShare:
    """The share of a one-process run: every row."""
    return RankShare(0, 0, grid.height)


def split_rows(plan: GridPlan, block_px: int, world_size: int) -> tuple[RankShare, ...]:
    """One contiguous, cost-balanced range of whole block rows per rank (some may be empty)."""
    if world_size < 1:
        raise PredictionError(f"world size {world_size}: must be at least 1")
    costs = row_costs(plan, block_px)
    bounds = balanced_bounds(costs, world_size)
    height = plan.grid.height
    return tuple(
        RankShare(
            rank, min(bounds[rank] * block_px, height), min(bounds[rank + 1] * block_px, height)
        )
        for rank in range(world_size)
    )


def row_costs(plan: GridPlan, block_px: int) -> list[int]:
    """The work in each block row: its strip's area inside region ∩ images, in pixels."""
    grid = plan.grid
    costs = []
    for row in grid.window.block_rows(block_px):
        strip = box(*grid.bounds_of(row))
        inside = plan.area.intersection(strip).area if plan.area.intersects(strip) else 0.0
        # Whole pixels: every rank must round the same float the same way to agree.
        costs.append(round(inside / grid.resolution**2))
    return costs


def balanced_bounds(costs: Sequence[int], parts: int) -> list[int]:
    """`parts + 1` monotone cut indices into `costs`: contiguous ranges whose largest sum is
    as small as contiguous ranges allow (the busiest rank sets the wall time). Ranges are
    filled in order up to that sum, so spare parts at the end get nothing."""
    if sum(costs) <= 0:  # nothing to do anywhere: share the rows by count
        costs = [1] * len(costs)
    low, high = max(costs, default=0), sum(costs)
    while low < high:  # the smallest bound that `parts` ranges can keep to
        middle = (low + high) // 2
        if len(_filled_up_to(costs, middle)) - 1 <= parts:
            high = middle
        else:
            low = middle + 1
    cuts = _filled_up_to(costs, low)
    return cuts + [len(costs)] * (parts + 1 - len(cuts))


def _filled_up_to(costs: Sequence[int], bound: int) -> list[int]:
    """Cut indices of ranges filled in order, each to at most `bound` (or one cost)."""
    cuts, total = [0], 0
    for i, cost in enumerate(costs):
        if total + cost > bound and i > cuts[-1]:
            cuts.append(i)
            total = 0
        total += cost
    cuts.append(len(costs))
    return cuts


def pooled_threads(shares: Sequence[RankShare], rank: int, local_ranks: range, threads: int) -> int:
    """The threads `rank` runs with when the ranks of its machine (`local_ranks`, each
    started with `threads`) pool them among those with rows to predict
    (`landcover.distenv.pooled_share`); `threads` for a rank without rows."""
    busy = [r for r in local_ranks if r < len(shares) and not shares[r].is_empty]
    return pooled_share(busy, rank, local_ranks, threads)


def sources_read(plan: GridPlan, share: RankShare, layout: WindowLayout) -> list[str]:
    """Paths of the images a share reads (its rows and the windows reaching past them), in
    the plan's order."""
    if share.is_empty:
        return []
    return plan.sources_read(share.window(plan.grid), layout.size)
