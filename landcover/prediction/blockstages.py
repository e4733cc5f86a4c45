"""What happens to one output block of a prediction, in three stages that
`landcover.prediction.pipeline` runs in three threads:

1. `prepare_block` (reader): the source pixels under every window that touches the block
   (`landcover.prediction.mosaic`), which of the block's pixels are inside the region, and the
   windows to run: those that touch such a pixel. No torch here.
2. `BlockRunner`, then `BlockBlender` (the calling thread): runs those windows through the
   model (`landcover.prediction.windows`) and hands on their logits in window order; blends
   them (`landcover.prediction.blend`) and turns them into class codes and, when asked,
   probabilities (uint8).
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
from shapely.geometry import box

from landcover.classes import NODATA_CODE
from landcover.prediction.blend import (
    LogitBlender,
    WindowLayout,
    argmax_classes,
    class_probabilities,
)
from landcover.prediction.blocks import Block, region_mask
from landcover.prediction.carry import WindowLogits
from landcover.prediction.gridwindow import Window
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.outfiles import PROBABILITY_NODATA, PROBABILITY_SCALE
from landcover.prediction.outgrid import GridPlan
from landcover.prediction.runtime import torch_threads
from landcover.prediction.windows import BlockPixels, WindowRunner
from tiling.sources.reader import RasterReader


@dataclass(frozen=True, slots=True)
class PreparedBlock:
    """A block ready for the model: its pixels and the windows to run (reader stage)."""

    block: Block  # its place in the schedule (`landcover.prediction.blocks`)
    pixels: BlockPixels | None  # None: the block lies outside the area, nothing to predict
    inside: npt.NDArray[np.bool_] | None  # (height, width): pixels with data in the region
    todo: tuple[tuple[int, int], ...]  # top-left (row, col) of the windows to run


@dataclass(frozen=True, slots=True)
class PredictedBlock:
    """A block's class codes and probabilities (None: leave the block unwritten)."""

    window: Window
    classes: npt.NDArray[np.uint8] | None  # (height, width)
    probabilities: npt.NDArray[np.uint8] | None  # (classes - 1, height, width)


def prepare_block(
    plan: GridPlan, layout: WindowLayout, reader: RasterReader, block: Block
) -> PreparedBlock:
    """Read the source pixels under the windows of `block` and pick the windows to run."""
    grid, window = plan.grid, block.window
    if not plan.area.intersects(box(*grid.bounds_of(window))):
        return PreparedBlock(block, None, None, ())
    data, covered = read_mosaic(plan, reader, block.extent)
    inside = covered[window.slices(block.extent)]
    if plan.region is not None:
        inside = inside & region_mask(plan.region, grid, window)
    # Only windows that touch an output pixel of this block are run.
    row0, col0 = window.row, window.col
    todo = tuple(
        (r, c)
        for r in block.rows
        for c in block.cols
        if inside[
            max(r - row0, 0) : r - row0 + layout.size,
            max(c - col0, 0) : c - col0 + layout.size,
        ].any()
    )
    pixels = BlockPixels(data, covered, block.extent, window)
    return PreparedBlock(block, pixels, inside, todo)


@dataclass(frozen=True, slots=True)
class RanBlock:
    """A block's window logits in window order, ready to blend (model stage)."""

    window: Window
    inside: npt.NDArray[np.bool_] | None  # None: the block lies outside the area
    logits: tuple[tuple[tuple[int, int], WindowLogits], ...]  # ((row, col), logits)


class BlockRunner:
    """Runs a prepared block's windows (the calling thread): the model's stage.

    Blocks must come in schedule order: the `WindowRunner` keeps the logits of windows that
    reach into the blocks after the one that ran them.
    """

    def __init__(self, windows: WindowRunner) -> None:
        self.windows = windows

    def __call__(self, prepared: PreparedBlock) -> RanBlock:
        """The logits of the windows of one block, in window order.

        On the CPU cutting and normalising the windows run on one thread and the model on
        torch's thread count now (`landcover.prediction.runtime.torch_threads`)."""
        window = prepared.block.window
        if prepared.block.starts_row:
            self.windows.new_block_row(window.row)
        if prepared.pixels is None or prepared.inside is None or not prepared.todo:
            return RanBlock(window, prepared.inside, ())
        logits = self.windows.run(prepared.pixels, prepared.todo)
        return RanBlock(window, prepared.inside, tuple(logits))


class BlockBlender:
    """Blends a block's window logits and turns them into uint8 outputs."""

    def __init__(
        self,
        layout: WindowLayout,
        num_classes: int,
        *,
        device: torch.device,
        probabilities: bool,
    ) -> None:
        self.layout, self.num_classes = layout, num_classes
        self.device, self.probabilities = device, probabilities

    def __call__(self, ran: RanBlock) -> PredictedBlock:
        """Class codes (0 outside the region) and, if asked, probabilities of one block.

        On the CPU the block's array work runs on one thread
        (`landcover.prediction.runtime.torch_threads`): it is memory-bound, and the cores
        belong to the model."""
        if self.device.type != "cpu":
            return self._blend(ran)
        with torch_threads(1):
            return self._blend(ran)

    def _blend(self, ran: RanBlock) -> PredictedBlock:
        window = ran.window
        height, width = window.height, window.width
        if ran.inside is None:
            return PredictedBlock(window, None, None)
        classes = np.zeros((height, width), dtype=np.uint8)
        probs = None
        if ran.logits:
            blender = LogitBlender(
                self.layout, self.num_classes, window, device=self.device, mean=self.probabilities
            )
            for (r, c), kept in ran.logits:
                blender.add(kept.logits, r, c, first_row=kept.first_row)
            inside_t = torch.from_numpy(ran.inside).to(self.device)
            # The argmax of the weighted sums (the weighted mean's, undivided), whether or not
            # the probabilities are asked for; code 0 (nodata) is never predicted, and is the
            # code outside the region: a multiply by the mask, not a masked write (which
            # torch runs element by element).
            codes = argmax_classes(blender.sums(first=1)).add_(1).mul_(inside_t)
            classes = codes.cpu().numpy()
            if self.probabilities:
                blended = blender.blended(first=1)
                p = class_probabilities(blended).mul_(PROBABILITY_SCALE).round_().to(torch.uint8)
                p = torch.where(inside_t, p, torch.full_like(p, PROBABILITY_NODATA))
                probs = p.cpu().numpy()
        if self.probabilities and probs is None:
            probs = np.full((self.num_classes - 1, height, width), PROBABILITY_NODATA, np.uint8)
        return PredictedBlock(window, classes, probs)


class BlockWriter:
    """Writes predicted blocks into the open class (and probabilities) GeoTIFFs of the
    window `target` of the grid (a rank's rows, a tile), and counts the pixels of each class
    code; `class_pixels[0]` also counts the unwritten blocks' pixels."""

    def __init__(
        self,
        classes_dst: Any,
        probabilities_dst: Any | None,
        num_classes: int,
        *,
        target: Window,
    ) -> None:
        self.classes_dst, self.probabilities_dst = classes_dst, probabilities_dst
        self.num_classes, self.target = num_classes, target
        self.class_pixels = np.zeros(num_classes, dtype=np.int64)

    def __call__(self, predicted: PredictedBlock) -> None:
        window = predicted.window
        if predicted.classes is None:
            # Nothing to predict: leave the tiles unwritten (sparse, read as nodata).
            self.class_pixels[NODATA_CODE] += window.height * window.width
            return
        counts = np.bincount(predicted.classes.ravel(), minlength=self.num_classes)
        self.class_pixels += counts[: self.num_classes]
        in_file = window.to_rasterio(origin=self.target)
        self.classes_dst.write(predicted.classes, 1, window=in_file)
        if self.probabilities_dst is not None and predicted.probabilities is not None:
            self.probabilities_dst.write(predicted.probabilities, window=in_file)
