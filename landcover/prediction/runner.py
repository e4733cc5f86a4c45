"""Predict a land-cover map for a region as one COG: region → windows → blended logits → COG.

This module holds the stage and its result: it checks the outputs, holds their lock, sets the
prediction up (`landcover.prediction.prepared`) and has the window-into-file loop
(`landcover.prediction.intofile`) predict the whole grid into a tiled GeoTIFF. The output
grid is cut into blocks (`block_px` square, `landcover.prediction.blocks`); for each block the
loop reads the source pixels under every window that touches it, runs those windows in
batches (`landcover.prediction.windows`), blends their logits with a smooth weight
(`landcover.prediction.blend`) and writes the block's classes; reading the next blocks and
writing the last ones overlap the model's work (`landcover.prediction.pipeline`).
Memory is bounded by a few blocks, never by the region: the logits of windows that reach into
the next block of the same block row are kept for it, and windows on the boundary between two
block rows are run once for each (about 12% more inference with 2048 px blocks and 256 px
windows) rather than keeping a region-wide strip of logits. The tiled GeoTIFF then becomes a
Cloud-Optimized GeoTIFF (GDAL's COG driver, overviews by mode) under a temporary name that is
renamed into place at the end.

A distributed run (`rank`, `world_size`) gives each rank whole block rows and writes parts
that rank 0 assembles into the same COG (`landcover.prediction.distributed`); this module
only says where a rank's rows are written.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from functools import partial

import rasterio
import torch

from landcover.errors import PredictionError
from landcover.outputlock import exclusive_outputs
from landcover.prediction.blocks import require_predicted_pixels
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import RankRun, run_rank
from landcover.prediction.intofile import AreaCounts, predict_into_file, shows_progress
from landcover.prediction.outfiles import OutputPaths, TempOutputs, check_outputs, write_cogs
from landcover.prediction.outgrid import GridPlan, OutputGrid
from landcover.prediction.prepared import PreparedPrediction, prediction_device, prepare_prediction
from landcover.prediction.ranks import RankShare, whole_grid
from landcover.prediction.setup import GDAL_CACHE_BYTES, warnings_to_log
from tiling.runtime.urls import check_storage_options

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PredictResult:
    """What a prediction wrote; on ranks other than 0 of a distributed run, the counts are
    those of the rank's own share."""

    out: str
    probabilities: str | None
    grid: OutputGrid
    sources: tuple[str, ...]
    windows: int  # windows run (those between two block rows run once for each)
    valid_pixels: int
    class_pixels: tuple[int, ...]  # per class code, code 0 = outside the region / no data
    elapsed_s: float


def predict_region(
    config: PredictConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    local_ranks: range | None = None,
) -> PredictResult:
    """Predict `config.region` (or the union of the images) and write `config.out` as a COG.

    With `world_size` > 1, each of the ranks 0..world_size-1 calls this with the same config:
    each predicts its whole block rows into a part beside the output; rank 0 then waits for
    every part and returns once the outputs are in place, identical to a one-process run's.
    Only rank 0 shows a progress bar. `local_ranks`: the ranks on this machine (this one
    included), which pool their CPU threads so that ranks without rows leave their cores to
    the others (`landcover.prediction.ranks.pooled_threads`).
    """
    started = time.perf_counter()
    with warnings_to_log():
        if not 0 <= rank < world_size:
            raise PredictionError(
                f"rank {rank} of world size {world_size}: need 0 <= rank < world size"
            )
        outputs = check_outputs(
            config.out,
            config.probabilities,
            overwrite=config.overwrite,
            storage_options=config.storage_options,
        )
        urls = [
            config.model,
            *config.images,
            outputs.out,
            outputs.probabilities or "",
            config.calibration or "",
        ]
        check_storage_options([u for u in urls if u], config.storage_options)
        if rank != 0:
            config = replace(config, progress=False)
        device = prediction_device(config)  # a bad option fails before the lock is taken
        with (
            _hold_outputs(outputs, rank),
            rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"),
        ):
            grid, plan, counts = _predict_and_write(
                config, outputs, device, rank, world_size, local_ranks
            )
    result = PredictResult(
        out=outputs.out,
        probabilities=outputs.probabilities,
        grid=grid,
        sources=tuple(s.path for s in plan.sources),
        windows=counts.windows,
        valid_pixels=int(counts.class_pixels[1:].sum()),
        class_pixels=tuple(int(v) for v in counts.class_pixels),
        elapsed_s=time.perf_counter() - started,
    )
    if rank == 0:
        logger.info(
            "wrote %s (%d valid px, %d windows, %.1f s)",
            result.out,
            result.valid_pixels,
            result.windows,
            result.elapsed_s,
        )
    return result


def _hold_outputs(outputs: OutputPaths, rank: int) -> AbstractContextManager[None]:
    """On rank 0 (the one process of a run, or the rank that assembles a job's parts), hold
    the lock of each output until it is in place: a second run into the same --out would
    otherwise remove this run's parts, or put its own file there (`landcover.outputlock`).
    The job's other ranks write only their parts."""
    if rank != 0:
        return nullcontext()
    return exclusive_outputs((outputs.out, outputs.probabilities), "predict")


def _predict_and_write(
    config: PredictConfig,
    outputs: OutputPaths,
    device: torch.device,
    rank: int,
    world_size: int,
    local_ranks: range | None,
) -> tuple[OutputGrid, GridPlan, AreaCounts]:
    """Set the prediction up, then predict the whole grid into the outputs, or this rank's
    rows into its part (and on rank 0 assemble the parts)."""
    # rank 0 speaks for the job
    prepared = prepare_prediction(config, device, max_pixels=config.max_pixels, quiet=rank != 0)
    grid, plan = prepared.grid, prepared.plan
    logger.info(
        "predicting %d x %d px at %g in %s from %d of %d images",
        grid.width,
        grid.height,
        grid.resolution,
        grid.crs.to_string(),
        len(plan.sources),
        len(prepared.sources),
    )
    if world_size > 1:
        run = RankRun(prepared, outputs, rank, world_size, local_ranks)
        return grid, plan, run_rank(run, partial(_predict_into, prepared))
    with TempOutputs(outputs, config.storage_options) as temps:
        counts = _predict_into(prepared, whole_grid(grid), temps.tiles_out, temps.tiles_prob)
        require_predicted_pixels(counts.class_pixels)
        write_cogs(temps, temps.tiles_out, temps.tiles_prob)
        temps.commit()
    return grid, plan, counts


def _predict_into(
    prepared: PreparedPrediction, share: RankShare, tiles_out: str, tiles_prob: str | None
) -> AreaCounts:
    """Predict the blocks of `share` (whole block rows) into tiled GeoTIFFs of its rows."""
    return predict_into_file(
        prepared,
        share.window(prepared.grid),
        tiles_out,
        tiles_prob,
        sources=[s.path for s in prepared.plan.sources],
        progress=shows_progress(prepared.config.progress),
    )
