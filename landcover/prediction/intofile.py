"""The window-into-file loop of every prediction: an area of the output grid into a tiled
GeoTIFF of that area alone.

`predict_into_file` predicts the blocks of one area of a `PreparedPrediction`'s grid (the
whole grid of a one-COG run, a rank's block rows, a tile of a tiled product) and writes their
classes, and the probabilities when asked, block by block: reading, inference and writing
overlap (`landcover.prediction.pipeline`), each block read, run, blended and written by
`landcover.prediction.blockstages`. A pixel comes out the same whichever area holds it
(`landcover.prediction.windows`), so parts, tiles and one COG agree byte for byte. The
caller turns the file into its output (a COG, a part, a tile).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt
import rasterio
from tqdm import tqdm

from landcover.prediction.blocks import block_schedule
from landcover.prediction.blockstages import (
    BlockBlender,
    BlockRunner,
    BlockWriter,
    PredictedBlock,
    PreparedBlock,
    prepare_block,
)
from landcover.prediction.gridwindow import Window
from landcover.prediction.outfiles import (
    class_profile,
    describe_class_raster,
    describe_probability_raster,
    probability_profile,
)
from landcover.prediction.pipeline import run_pipeline
from landcover.prediction.prepared import PreparedPrediction
from landcover.prediction.setup import FreedMemory, block_cache_bytes
from landcover.prediction.tta import tta_ops
from landcover.prediction.windows import WindowRunner
from tiling.sources.reader import RasterReader

# GDAL_NUM_THREADS while the blocks are predicted (`predict_into_file`).
PIPELINE_GDAL_THREADS = "1"


@dataclass(frozen=True, slots=True)
class AreaCounts:
    """What predicting an area counted: windows run (those between two block rows run once
    for each) and pixels per class code (code 0: outside the region, or no data)."""

    windows: int
    class_pixels: npt.NDArray[np.int64]


def shows_progress(progress: bool | None) -> bool:
    """Whether to show a progress bar: as asked, or (None) when stderr is a terminal."""
    return progress if progress is not None else sys.stderr.isatty()


def predict_into_file(
    prepared: PreparedPrediction,
    area: Window,
    classes_path: str,
    probabilities_path: str | None = None,
    *,
    sources: Sequence[str],
    band_tags: Mapping[str, str] | None = None,
    progress: bool = False,
) -> AreaCounts:
    """Predict the blocks of `area` (whole blocks of the grid's block lattice from its
    top-left corner) into a tiled GeoTIFF of the area's grid at the local path
    `classes_path`, and the probabilities into one at `probabilities_path` (None: none).

    The class raster lists `sources` as the images read, is tagged with what ran the model
    and carries `band_tags` on its band; `progress` shows a bar of the windows run."""
    config, meta, layout = prepared.config, prepared.meta, prepared.layout
    windows = WindowRunner(
        prepared.model,
        meta,
        layout,
        batch_size=config.batch_size,
        where=config.model,
        device=prepared.device,
        tta_ops=tta_ops(config.tta),
    )
    with ExitStack() as stack:
        target = prepared.grid.sub(area)
        out_bands = 1 + (meta.num_classes - 1 if probabilities_path is not None else 0)
        cache = block_cache_bytes(
            config.resolved_block_px, target.width, out_bands, in_bands=meta.in_channels
        )
        # GDAL decodes the sources and compresses the tiles on the reader's and the writer's
        # thread alone: those threads only have to keep ahead of (behind) the model, and more
        # GDAL threads would take cores from the model's.
        stack.enter_context(
            rasterio.Env(GDAL_CACHEMAX=cache, GDAL_NUM_THREADS=PIPELINE_GDAL_THREADS)
        )
        dst = stack.enter_context(rasterio.open(classes_path, "w", **class_profile(target)))
        describe_class_raster(dst, meta, sources=sources)
        dst.update_tags(**prepared.model.inference.tags())  # what ran: backend, precision
        if band_tags:
            dst.update_tags(1, **band_tags)
        prob = None
        if probabilities_path is not None:
            profile = probability_profile(target, meta)
            prob = stack.enter_context(rasterio.open(probabilities_path, "w", **profile))
            describe_probability_raster(prob, meta)
        schedule = block_schedule(layout, area, config.resolved_block_px)
        bar = stack.enter_context(
            tqdm(
                total=sum(block.owned_windows for block in schedule),
                unit="window",
                disable=not progress,
                desc="predict",
            )
        )
        # A reader per call, closed after it: the pipeline reads in a thread of its own, and
        # a thread's image handles (each with GDAL's buffers of a decoded block, a megabyte
        # or more) end only with the reader's close().
        reader = RasterReader(storage_options=config.storage_options)
        stack.callback(reader.close)
        runner = BlockRunner(windows)
        blender = BlockBlender(
            layout, meta.num_classes, device=prepared.device, probabilities=prob is not None
        )
        writer = BlockWriter(dst, prob, meta.num_classes, target=area)
        memory = FreedMemory()

        # A block is blended on the model's thread, after its windows. Blending it in the
        # writer's thread, beside the model running the next block, was no faster on a
        # 2-core CPU (the model's threads lose the core the blending takes), and it would
        # hold one more block's window logits.
        def predict(block: PreparedBlock) -> PredictedBlock:
            bar.update(block.block.owned_windows)
            predicted = blender(runner(block))
            if block.todo:
                memory.release()  # the block's logits and activations are free by now
            return predicted

        # The pipeline's threads have stopped when it returns or raises: the files and the
        # reader are closed after them.
        run_pipeline(
            schedule,
            partial(prepare_block, prepared.plan, layout, reader),
            predict,
            writer,
            threaded=config.pipeline,
        )
    return AreaCounts(windows.windows_run, writer.class_pixels)
