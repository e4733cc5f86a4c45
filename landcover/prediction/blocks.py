"""The block schedule of a prediction: the output grid cut into square blocks, the windows a
block owns (for the progress bar), which pixels of a block the region covers, and the check
that a finished prediction found data in it.

A pixel is inside the region when its centre is; these functions only rasterize the region,
they read no pixel of the images.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
from rasterio.features import rasterize
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry

from landcover.errors import RegionError
from landcover.prediction.blend import WindowLayout
from landcover.prediction.outgrid import GridPlan, OutputGrid


def blocks(grid: OutputGrid, block_px: int) -> Iterator[tuple[int, int, int, int]]:
    """(row0, col0, height, width) of each block, row by row; edge blocks are cut short."""
    for row0 in range(0, grid.height, block_px):
        for col0 in range(0, grid.width, block_px):
            yield row0, col0, min(block_px, grid.height - row0), min(block_px, grid.width - col0)


def owned_windows(
    layout: WindowLayout,
    rows: Sequence[int],
    cols: Sequence[int],
    row0: int,
    col0: int,
    height: int,
    width: int,
) -> int:
    """How many of the windows `rows` x `cols` have their centre in the block: every window
    is owned by exactly one block, so the counts add up to the layout's windows."""
    half = layout.size // 2
    own_rows = sum(1 for r in rows if row0 <= min(r + half, layout.height - 1) < row0 + height)
    own_cols = sum(1 for c in cols if col0 <= min(c + half, layout.width - 1) < col0 + width)
    return own_rows * own_cols


def region_mask(
    geometry: BaseGeometry, grid: OutputGrid, row0: int, col0: int, height: int, width: int
) -> npt.NDArray[np.bool_]:
    """(height, width) bool: the block's pixels whose centre lies in `geometry`."""
    mask = rasterize(
        [(geometry, 1)],
        out_shape=(height, width),
        transform=grid.window_transform(row0, col0),
        fill=0,
        dtype="uint8",
        all_touched=False,  # a pixel is inside when its centre is
    )
    return np.asarray(mask, dtype=bool)


def region_has_pixels(plan: GridPlan, block_px: int) -> bool:
    """Whether any pixel centre lies in region ∩ images (rasterizing only, no reads)."""
    for row0, col0, height, width in blocks(plan.grid, block_px):
        if not plan.area.intersects(box(*plan.grid.window_bounds(row0, col0, height, width))):
            continue
        if region_mask(plan.area, plan.grid, row0, col0, height, width).any():
            return True
    return False


def require_predicted_pixels(class_pixels: npt.NDArray[np.int64]) -> None:
    """Raise `RegionError` when the tally per class code has no pixel but nodata (code 0)."""
    if class_pixels[1:].sum() == 0:
        raise RegionError(
            "no image pixel with data inside the region (all nodata after masking); "
            "check the region and the images' nodata"
        )
