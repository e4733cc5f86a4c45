"""The block schedule of a prediction: a window of the output grid cut into square blocks,
each with the model windows that touch it and the number it owns (for the progress bar);
which pixels of a block the region covers, and the check that a finished prediction found
data in it.

`block_schedule` is the one place a schedule is worked out: the one-process run (the whole
grid), each rank of a distributed run (its block rows), each tile of a tiled product and each
tile task on a task scheduler ask it for the window they predict, and it is cached, so the
progress bar's count and the run walk the same list, computed once.

`resolve_block_px` settles the block edge (`--block-px`, `auto` by default) once per
prediction, from the model's classes, its windows and the device, so that every rank, tile and
task of a job cuts the same blocks.

A pixel is inside the region when its centre is; these functions only rasterize the region,
they read no pixel of the images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from rasterio.features import rasterize
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry

from landcover.errors import RegionError
from landcover.prediction.blend import WindowLayout
from landcover.prediction.choices import (
    BLOCK_AUTO_CPU_BYTES,
    BLOCK_AUTO_DEVICE_PX,
    BLOCK_AUTO_MAX_PX,
)
from landcover.prediction.gridwindow import Window
from landcover.prediction.outfiles import COG_BLOCK_PX
from landcover.prediction.outgrid import GridPlan, OutputGrid

# Schedules kept: a process predicts one grid (a rank's share, or a tile task's tiles).
_SCHEDULES_CACHED = 64


@dataclass(frozen=True, slots=True)
class Block:
    """One block of a schedule: its output pixels, the top-left rows and columns of the model
    windows that touch them, the source pixels under those windows, and how many of the
    windows it owns (those whose centre lies in it: every window is owned by one block)."""

    window: Window
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    extent: Window  # the pixels under every window that touches the block
    owned_windows: int
    starts_row: bool  # the first block of its block row: no carried logits reach into it


_FLOAT_BYTES = 4


def block_bytes_per_px(num_classes: int, layout: WindowLayout, *, probabilities: bool) -> float:
    """The bytes a block holds per output pixel while it is predicted on the CPU:

    - the blender's weighted sums (`num_classes` float32 planes) and weights (one plane), and
      the blended scores of the classes it picks from (`num_classes` - 1);
    - the logits of every window that touches the block, kept until they are added in window
      order: `num_classes` planes times the windows' coverage of a pixel, (window / stride)²;
    - the argmax's running maximum, the class codes and its masks (about two planes);
    - with probabilities, their exponentials and the uint8 planes (1.5 planes a class)."""
    stride = max(1, layout.size - layout.overlap)
    coverage = (layout.size / stride) ** 2
    planes = num_classes + 1 + (num_classes - 1) + num_classes * coverage + 2
    if probabilities:
        planes += 1.5 * (num_classes - 1)
    return planes * _FLOAT_BYTES


def resolve_block_px(
    block_px: int | None,
    *,
    num_classes: int,
    layout: WindowLayout,
    probabilities: bool,
    on_cpu: bool,
) -> int:
    """The block edge of a prediction: `block_px` as given, or (None: `--block-px auto`)

    - on the CPU, the largest multiple of the output's COG tile (COG_BLOCK_PX) whose block
      arrays (`block_bytes_per_px`: the model's classes, its windows' overlap, the
      probabilities) fit in BLOCK_AUTO_CPU_BYTES, at most BLOCK_AUTO_MAX_PX and at least one
      COG tile: the process's peak memory then stays flat as the region grows;
    - on a GPU, BLOCK_AUTO_DEVICE_PX (the block's arrays are in device memory).

    Depends on nothing but the model's metadata, the window layout and the device's kind, so
    that every rank, tile and task of a prediction resolves the same edge."""
    if block_px is not None:
        return block_px
    if not on_cpu:
        return BLOCK_AUTO_DEVICE_PX
    per_px = block_bytes_per_px(num_classes, layout, probabilities=probabilities)
    fits_px = int((BLOCK_AUTO_CPU_BYTES / per_px) ** 0.5)
    tiles = min(fits_px, BLOCK_AUTO_MAX_PX) // COG_BLOCK_PX
    return max(1, tiles) * COG_BLOCK_PX


def blocks(grid: OutputGrid, block_px: int) -> list[Window]:
    """The blocks of the whole grid, row by row; edge blocks are cut short."""
    return grid.window.blocks(block_px)


@lru_cache(maxsize=_SCHEDULES_CACHED)
def block_schedule(layout: WindowLayout, area: Window, block_px: int) -> tuple[Block, ...]:
    """The blocks of `area` (the grid's, a rank's rows, a tile's), row by row, each with
    its model windows: the order every schedule of a prediction runs in."""
    schedule = []
    for window in area.blocks(block_px):
        rows = layout.rows_touching(window.row, window.row_stop)
        cols = layout.cols_touching(window.col, window.col_stop)
        extent = Window(
            rows[0], cols[0], rows[-1] + layout.size - rows[0], cols[-1] + layout.size - cols[0]
        )
        owned = owned_windows(layout, rows, cols, window)
        schedule.append(Block(window, rows, cols, extent, owned, window.col == area.col))
    return tuple(schedule)


def owned_windows(
    layout: WindowLayout, rows: Sequence[int], cols: Sequence[int], block: Window
) -> int:
    """How many of the windows `rows` x `cols` have their centre in `block`: every window
    is owned by exactly one block, so the counts add up to the layout's windows."""
    half = layout.size // 2
    own_rows = sum(
        1 for r in rows if block.row <= min(r + half, layout.height - 1) < block.row_stop
    )
    own_cols = sum(1 for c in cols if block.col <= min(c + half, layout.width - 1) < block.col_stop)
    return own_rows * own_cols


def region_mask(geometry: BaseGeometry, grid: OutputGrid, window: Window) -> npt.NDArray[np.bool_]:
    """(height, width) bool: the window's pixels whose centre lies in `geometry`."""
    mask = rasterize(
        [(geometry, 1)],
        out_shape=(window.height, window.width),
        transform=grid.window_transform(window.row, window.col),
        fill=0,
        dtype="uint8",
        all_touched=False,  # a pixel is inside when its centre is
    )
    return np.asarray(mask, dtype=bool)


def region_has_pixels(plan: GridPlan, block_px: int) -> bool:
    """Whether any pixel centre lies in region ∩ images (rasterizing only, no reads)."""
    for window in blocks(plan.grid, block_px):
        if not plan.area.intersects(box(*plan.grid.bounds_of(window))):
            continue
        if region_mask(plan.area, plan.grid, window).any():
            return True
    return False


def require_predicted_pixels(class_pixels: npt.NDArray[np.int64]) -> None:
    """Raise `RegionError` when the tally per class code has no pixel but nodata (code 0)."""
    if class_pixels[1:].sum() == 0:
        raise RegionError(
            "no image pixel with data inside the region (all nodata after masking); "
            "check the region and the images' nodata"
        )
