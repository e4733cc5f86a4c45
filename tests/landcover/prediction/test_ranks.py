"""The split of a prediction over ranks (landcover.prediction.ranks): whole block rows, every
row once, balanced by the region's area in each row, the images each share reads."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import shapely
from affine import Affine
from rasterio.crs import CRS
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry

from landcover.errors import PredictionError
from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import blocks
from landcover.prediction.outgrid import GridPlan, OutputGrid, plan_output_grid
from landcover.prediction.ranks import (
    RankShare,
    balanced_bounds,
    pooled_threads,
    row_costs,
    sources_read,
    split_rows,
    whole_grid,
)
from landcover.prediction.setup import open_images
from tests.landcover.prediction.inputs import ORIGIN, pixels, write_image

# 1,000 x 600 px at 1 m; the region shapes below are in its coordinates.
GRID = OutputGrid(
    CRS.from_epsg(32618), Affine(1.0, 0.0, ORIGIN[0], 0.0, -1.0, ORIGIN[1]), 1000, 600
)


def plan_over(area: BaseGeometry) -> GridPlan:
    """A plan whose region ∩ images is `area` (the split reads no image)."""
    return GridPlan(GRID, (), (), area, area)


def grid_box(col0: float, row0: float, col1: float, row1: float) -> BaseGeometry:
    """A rectangle of the grid by pixel columns and rows."""
    (x0, y0), (x1, y1) = GRID.transform @ (col0, row0), GRID.transform @ (col1, row1)
    return box(min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))


STATE = shapely.Polygon(  # wide in the south, a narrow tip in the north, like Virginia's
    [GRID.transform @ xy for xy in [(50, 580), (990, 560), (600, 200), (300, 10), (250, 300)]]
)


@pytest.mark.parametrize("world_size", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("block_px", [32, 100])
def test_shares_are_whole_block_rows_covering_the_grid_once(world_size: int, block_px: int) -> None:
    shares = split_rows(plan_over(STATE), block_px, world_size)
    assert [s.rank for s in shares] == list(range(world_size))
    assert shares[0].row0 == 0 and shares[-1].row1 == GRID.height
    for before, after in itertools.pairwise(shares):
        assert before.row1 == after.row0  # contiguous, in rank order
    for share in shares:  # block row boundaries (or the grid's end)
        assert {share.row0 % block_px, share.row1 % block_px} <= {0, GRID.height % block_px}
    every = [b for s in shares for b in s.blocks(GRID, block_px)]
    assert every == list(blocks(GRID, block_px))  # each block once, in one-process order


def test_more_ranks_than_block_rows_leaves_some_empty() -> None:
    plan = plan_over(STATE)
    shares = split_rows(plan, 100, 9)  # 6 block rows
    costs = row_costs(plan, 100)
    work = [sum(costs[s.row0 // 100 : -(-s.row1 // 100)]) for s in shares]
    assert max(work) == max(costs)  # no rank holds more than the largest row
    assert 3 <= sum(not s.is_empty for s in shares) <= 6
    assert all(s.blocks(GRID, 100) == [] for s in shares if s.is_empty)


def test_shares_balance_the_region_not_the_rows() -> None:
    plan = plan_over(STATE)
    costs = row_costs(plan, 20)
    assert costs[-1] == 0 and max(costs) > 5 * min(c for c in costs if c > 0)
    shares = split_rows(plan, 20, 4)
    work = [sum(costs[s.row0 // 20 : s.row1 // 20]) for s in shares]
    rows = [s.row1 - s.row0 for s in shares]
    assert max(work) <= 1.1 * sum(work) / 4  # within 10 % of the ideal
    assert max(rows) >= 2 * min(rows)  # the narrow north gets more rows than the wide south
    # Equal numbers of rows would leave one rank with far more work.
    equal = [sum(costs[a:b]) for a, b in [(0, 8), (8, 16), (16, 23), (23, 30)]]
    assert max(equal) > 1.3 * sum(costs) / 4


def test_rows_outside_the_region_cost_nothing() -> None:
    # Only the bottom 200 rows hold data: two ranks split them, the empty top goes to rank 0.
    shares = split_rows(plan_over(grid_box(0, 400, 1000, 600)), 50, 2)
    assert (shares[0].row0, shares[0].row1, shares[1].row1) == (0, 500, 600)


@pytest.mark.parametrize(
    ("costs", "parts", "cuts"),
    [
        ([0, 0, 5, 5], 2, [0, 3, 4]),
        ([1] * 10, 3, [0, 4, 8, 10]),
        ([9, 1, 1, 1], 2, [0, 1, 4]),
        ([0, 0, 0], 2, [0, 2, 3]),  # nothing to do anywhere: rows shared by count
        ([4], 3, [0, 1, 1, 1]),
        ([3, 3, 4], 2, [0, 2, 3]),
        ([0, 6, 0, 0, 6], 2, [0, 4, 5]),  # rows without work go with the rows before
    ],
)
def test_balanced_bounds(costs: list[int], parts: int, cuts: list[int]) -> None:
    assert balanced_bounds(costs, parts) == cuts


def test_the_split_refuses_an_empty_world() -> None:
    with pytest.raises(PredictionError, match="world size 0: must be at least 1"):
        split_rows(plan_over(STATE), 32, 0)


def test_a_share_grid_is_its_rows_of_the_output_grid() -> None:
    (_, second) = split_rows(plan_over(STATE), 100, 2)
    rows = second.grid(GRID)
    assert (rows.width, rows.height) == (1000, second.row1 - second.row0)
    assert rows.transform == GRID.window_transform(second.row0, 0)
    assert whole_grid(GRID).grid(GRID) == GRID


def test_a_share_reads_the_images_under_its_rows_and_its_windows_reach(tmp_path: Path) -> None:
    # Three images stacked north to south, 60 px each; windows of 32 px reach 32 px past
    # a share's rows.
    paths = []
    for i in range(3):
        transform = Affine(1.0, 0.0, ORIGIN[0], 0.0, -1.0, ORIGIN[1] - 60 * i)
        paths.append(
            write_image(tmp_path / f"{i}.tif", pixels(60, 40, seed=i), transform=transform)
        )
    plan = plan_output_grid(open_images([str(p) for p in paths]), None, resolution_m=1.0)
    layout = WindowLayout.over(plan.grid.height, plan.grid.width, size=32, overlap=8)
    top, middle, bottom = split_rows(plan, 60, 3)
    assert sources_read(plan, top, layout) == [str(paths[0]), str(paths[1])]
    assert sources_read(plan, middle, layout) == [str(p) for p in paths]
    assert sources_read(plan, bottom, layout) == [str(paths[1]), str(paths[2])]


def test_ranks_without_rows_leave_their_threads_to_their_machines_busy_ranks() -> None:
    # 2 machines x 3 ranks, 2 threads each; rows only for ranks 0, 1 and 3
    shares = [RankShare(r, 0, 10) if r in (0, 1, 3) else RankShare(r, 10, 10) for r in range(6)]
    first, second = range(0, 3), range(3, 6)
    assert [pooled_threads(shares, r, first, 2) for r in first] == [3, 3, 2]
    assert [pooled_threads(shares, r, second, 2) for r in second] == [6, 2, 2]
    # a machine of one rank, or where every rank has rows, keeps what it has
    assert pooled_threads(shares, 0, range(0, 1), 4) == 4
    assert [pooled_threads(shares, r, range(0, 2), 1) for r in (0, 1)] == [1, 1]
