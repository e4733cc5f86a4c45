"""What happens to one output block of a prediction, in three stages that
`landcover.prediction.pipeline` runs in three threads:

1. `prepare_block` (reader): the source pixels under every window that touches the block
   (`landcover.prediction.mosaic`), which of the block's pixels are inside the region, and the
   windows to run: those that touch such a pixel. No torch here.
2. `BlockPredictor` (the calling thread): runs those windows (`landcover.prediction.windows`),
   blends their logits (`landcover.prediction.blend`) and turns them into class codes and,
   when asked, probabilities (uint8).
3. `BlockWriter` (writer): writes both into the tiled GeoTIFFs and tallies the class pixels.
   A block outside the area is never written: its tiles stay sparse and read as nodata.

The stages are plain functions of a block, so running them one after another in one thread
(`PredictConfig.pipeline=False`) gives the very same bytes as the threads do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from rasterio.windows import Window
from shapely.geometry import box

from landcover.classes import NODATA_CODE
from landcover.prediction.blend import (
    LogitBlender,
    WindowLayout,
    argmax_classes,
    class_probabilities,
)
from landcover.prediction.blocks import owned_windows, region_mask
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.outfiles import PROBABILITY_NODATA, PROBABILITY_SCALE
from landcover.prediction.outgrid import GridPlan
from landcover.prediction.windows import Block, WindowRunner
from tiling.reader import RasterReader

# (row0, col0, height, width) of an output block in grid pixels
BlockRect = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class PreparedBlock:
    """A block ready for the model: its pixels and the windows to run (reader stage)."""

    rect: BlockRect
    owned_windows: int  # windows whose centre lies in the block (for the progress bar)
    block: Block | None  # None: the block lies outside the area, nothing to predict
    inside: npt.NDArray[np.bool_] | None  # (height, width): pixels with data in the region
    todo: tuple[tuple[int, int], ...]  # top-left (row, col) of the windows to run


@dataclass(frozen=True, slots=True)
class PredictedBlock:
    """A block's class codes and probabilities (None: leave the block unwritten)."""

    rect: BlockRect
    classes: npt.NDArray[np.uint8] | None  # (height, width)
    probabilities: npt.NDArray[np.uint8] | None  # (classes - 1, height, width)


def prepare_block(
    plan: GridPlan, layout: WindowLayout, reader: RasterReader, rect: BlockRect
) -> PreparedBlock:
    """Read the source pixels under the windows of block `rect` and pick the windows to run."""
    grid = plan.grid
    row0, col0, height, width = rect
    rows = layout.rows_touching(row0, row0 + height)
    cols = layout.cols_touching(col0, col0 + width)
    owned = owned_windows(layout, rows, cols, row0, col0, height, width)
    if not plan.area.intersects(box(*grid.window_bounds(row0, col0, height, width))):
        return PreparedBlock(rect, owned, None, None, ())
    ext_row0, ext_col0 = rows[0], cols[0]
    ext_h, ext_w = rows[-1] + layout.size - ext_row0, cols[-1] + layout.size - ext_col0
    data, covered = read_mosaic(plan, reader, ext_row0, ext_col0, ext_h, ext_w)
    crop = (
        slice(row0 - ext_row0, row0 - ext_row0 + height),
        slice(col0 - ext_col0, col0 - ext_col0 + width),
    )
    inside = covered[crop]
    if plan.region is not None:
        inside = inside & region_mask(plan.region, grid, row0, col0, height, width)
    # Only windows that touch an output pixel of this block are run.
    todo = tuple(
        (r, c)
        for r in rows
        for c in cols
        if inside[
            max(r - row0, 0) : r - row0 + layout.size,
            max(c - col0, 0) : c - col0 + layout.size,
        ].any()
    )
    block = Block(data, covered, ext_row0, ext_col0, row0, col0, height, width)
    return PreparedBlock(rect, owned, block, inside, todo)


class BlockPredictor:
    """Runs a prepared block's windows and turns the blended logits into uint8 outputs.

    Blocks must come in schedule order: the `WindowRunner` carries the logits of windows that
    reach into the next block of a block row.
    """

    def __init__(
        self,
        windows: WindowRunner,
        num_classes: int,
        *,
        device: torch.device,
        probabilities: bool,
    ) -> None:
        self.windows, self.num_classes = windows, num_classes
        self.device, self.probabilities = device, probabilities

    def __call__(self, prepared: PreparedBlock) -> PredictedBlock:
        """Class codes (0 outside the region) and, if asked, probabilities of one block."""
        row0, col0, height, width = prepared.rect
        if col0 == 0:
            self.windows.new_block_row()
        if prepared.block is None or prepared.inside is None:
            return PredictedBlock(prepared.rect, None, None)
        classes = np.zeros((height, width), dtype=np.uint8)
        probs = None
        if prepared.todo:
            blender = LogitBlender(
                self.windows.layout, self.num_classes, row0, col0, height, width, device=self.device
            )
            self.windows.run(prepared.block, prepared.todo, blender)
            blended = blender.blended(first=1)  # code 0 (nodata) is never predicted
            inside_t = torch.from_numpy(prepared.inside).to(self.device)
            codes = argmax_classes(blended).add_(1).masked_fill_(~inside_t, 0)
            classes = codes.cpu().numpy()
            if self.probabilities:
                p = class_probabilities(blended).mul_(PROBABILITY_SCALE).round_().to(torch.uint8)
                p = torch.where(inside_t, p, torch.full_like(p, PROBABILITY_NODATA))
                probs = p.cpu().numpy()
        if self.probabilities and probs is None:
            probs = np.full((self.num_classes - 1, height, width), PROBABILITY_NODATA, np.uint8)
        return PredictedBlock(prepared.rect, classes, probs)


class BlockWriter:
    """Writes predicted blocks into the open class (and probabilities) GeoTIFFs, whose first
    row is grid row `first_row` (a rank's part starts at its first block row) and whose first
    column is grid column `first_col` (a tile of a tiled product), and counts the pixels of
    each class code; `class_pixels[0]` also counts the unwritten blocks' pixels."""

    def __init__(
        self,
        classes_dst: Any,
        probabilities_dst: Any | None,
        num_classes: int,
        *,
        first_row: int = 0,
        first_col: int = 0,
    ) -> None:
        self.classes_dst, self.probabilities_dst = classes_dst, probabilities_dst
        self.num_classes, self.first_row = num_classes, first_row
        self.first_col = first_col
        self.class_pixels = np.zeros(num_classes, dtype=np.int64)

    def __call__(self, predicted: PredictedBlock) -> None:
        row0, col0, height, width = predicted.rect
        if predicted.classes is None:
            # Nothing to predict: leave the tiles unwritten (sparse, read as nodata).
            self.class_pixels[NODATA_CODE] += height * width
            return
        counts = np.bincount(predicted.classes.ravel(), minlength=self.num_classes)
        self.class_pixels += counts[: self.num_classes]
        window = Window(col0 - self.first_col, row0 - self.first_row, width, height)
        self.classes_dst.write(predicted.classes, 1, window=window)
        if self.probabilities_dst is not None and predicted.probabilities is not None:
            self.probabilities_dst.write(predicted.probabilities, window=window)
