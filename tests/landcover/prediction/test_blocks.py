"""The block schedule (landcover.prediction.blocks): blocks tile the grid, every window is
owned by one block, and the region mask follows pixel centres."""

from __future__ import annotations

import numpy as np
import pytest
from affine import Affine
from rasterio.crs import CRS
from shapely.geometry import box

from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import blocks, owned_windows, region_mask
from landcover.prediction.outgrid import OutputGrid

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
        owned += owned_windows(layout, rows, cols, row0, col0, height, width)
    assert owned == layout.num_windows


def test_region_mask_takes_pixels_whose_centre_is_inside() -> None:
    # Holds the centres of columns 2..4 and rows 1..2 of the block at (row 10, col 20).
    region = box(500_022.4, 3_999_987.4, 500_025.0, 3_999_989.0)
    mask = region_mask(region, GRID, 10, 20, 5, 8)
    expected = np.zeros((5, 8), dtype=bool)
    expected[1:3, 2:5] = True
    assert mask.dtype == bool
    assert (mask == expected).all()
