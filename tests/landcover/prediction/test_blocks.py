"""The block schedule (landcover.prediction.blocks): blocks tile the grid, every window is
owned by one block, and the region mask follows pixel centres."""

from __future__ import annotations

import numpy as np
import pytest
from affine import Affine
from rasterio.crs import CRS
from shapely.geometry import box

from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import block_schedule, blocks, owned_windows, region_mask
from landcover.prediction.gridwindow import Window
from landcover.prediction.outgrid import OutputGrid
from landcover.prediction.ranks import RankShare

GRID = OutputGrid(CRS.from_epsg(32618), Affine(1.0, 0.0, 500_000.0, 0.0, -1.0, 4_000_000.0), 90, 75)


@pytest.mark.parametrize("block_px", [16, 33, 64, 128])
def test_blocks_cover_the_grid_once(block_px: int) -> None:
    hits = np.zeros((GRID.height, GRID.width), dtype=np.int64)
    for row0, col0, height, width in blocks(GRID, block_px):
        assert 0 < height <= block_px and 0 < width <= block_px
        hits[row0 : row0 + height, col0 : col0 + width] += 1
    assert (hits == 1).all()


@pytest.mark.parametrize(("block_px", "size", "overlap"), [(16, 32, 8), (33, 32, 0), (64, 16, 4)])
def test_every_window_is_owned_by_one_block(block_px: int, size: int, overlap: int) -> None:
    layout = WindowLayout.over(GRID.height, GRID.width, size=size, overlap=overlap)
    owned = 0
    for row0, col0, height, width in blocks(GRID, block_px):
        rows = layout.rows_touching(row0, row0 + height)
        cols = layout.cols_touching(col0, col0 + width)
        owned += owned_windows(layout, rows, cols, Window(row0, col0, height, width))
    assert owned == layout.num_windows


def test_region_mask_takes_pixels_whose_centre_is_inside() -> None:
    # Holds the centres of columns 2..4 and rows 1..2 of the block at (row 10, col 20).
    region = box(500_022.4, 3_999_987.4, 500_025.0, 3_999_989.0)
    mask = region_mask(region, GRID, Window(10, 20, 5, 8))
    expected = np.zeros((5, 8), dtype=bool)
    expected[1:3, 2:5] = True
    assert mask.dtype == bool
    assert (mask == expected).all()


@pytest.mark.parametrize(("block_px", "world_size"), [(16, 3), (33, 2), (64, 4)])
def test_every_schedule_is_the_one_block_schedule(block_px: int, world_size: int) -> None:
    # A rank's share and a tile walk the blocks of their own window through the one
    # schedule: the shares' blocks, in rank order, are the whole grid's, windows included.
    layout = WindowLayout.over(GRID.height, GRID.width, size=32, overlap=8)
    whole = block_schedule(layout, GRID.window, block_px)
    assert [b.window for b in whole] == blocks(GRID, block_px)
    assert sum(b.owned_windows for b in whole) == layout.num_windows
    assert block_schedule(layout, GRID.window, block_px) is whole  # computed once
    rows = len(GRID.window.block_rows(block_px))
    step = -(-rows // world_size) * block_px
    shares = [
        RankShare(r, min(r * step, GRID.height), min((r + 1) * step, GRID.height))
        for r in range(world_size)
    ]
    parts = [b for s in shares for b in block_schedule(layout, s.window(GRID), block_px)]
    assert parts == list(whole)
    tile = Window(10, 7, 50, 41)
    in_tile = block_schedule(layout, tile, block_px)
    assert [b.window.col == tile.col for b in in_tile] == [b.starts_row for b in in_tile]
    for block in in_tile:
        assert block.extent.row <= block.window.row and block.extent.col <= block.window.col
        assert block.extent.row_stop >= block.window.row_stop
        assert block.extent.col_stop >= block.window.col_stop
