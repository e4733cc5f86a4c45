"""Predict a land-cover map for a region: region → windows → blended logits → COG.

This module holds the result and the loop over blocks (the configuration is
`landcover.prediction.config`). The output grid is
cut into blocks (`block_px` square, `landcover.prediction.blocks`). For each block we read the
source pixels under every window that touches it, run those windows in batches
(`landcover.prediction.windows`), blend their logits with a smooth weight
(`landcover.prediction.blend`) and write the block's classes into a tiled GeoTIFF
(`landcover.prediction.blockstages`); reading the next blocks and writing the last ones overlap
the model's work (`landcover.prediction.pipeline`).
Memory is bounded by a few blocks, never by the region: the logits of windows that reach into
the next block of the same block row are kept for it, and windows on the boundary between two
block rows are run once for each (about 12% more inference with 2048 px blocks and 256 px
windows) rather than keeping a region-wide strip of logits. The tiled GeoTIFF then becomes a
Cloud-Optimized GeoTIFF (GDAL's COG driver, overviews by mode) under a temporary name that is
renamed into place at the end.

A distributed run (`rank`, `world_size`) gives each rank whole block rows and writes parts
that rank 0 assembles into the same COG (`landcover.prediction.distributed`); this module
only picks the blocks a rank runs and where it writes them.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from tqdm import tqdm

from landcover.devices import torch_device
from landcover.errors import PredictionError, RegionError
from landcover.models.modelfile import ModelMeta
from landcover.outputlock import exclusive_outputs
from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import (
    block_schedule,
    region_has_pixels,
    require_predicted_pixels,
)
from landcover.prediction.blockstages import (
    BlockPredictor,
    BlockWriter,
    PredictedBlock,
    PreparedBlock,
    prepare_block,
)
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import RankRun, run_rank
from landcover.prediction.outfiles import (
    OutputPaths,
    TempOutputs,
    check_outputs,
    class_profile,
    describe_class_raster,
    describe_probability_raster,
    probability_profile,
    write_cogs,
)
from landcover.prediction.outgrid import GridPlan, OutputGrid, plan_output_grid
from landcover.prediction.pipeline import run_pipeline
from landcover.prediction.ranks import RankShare, whole_grid
from landcover.prediction.region import parse_crs
from landcover.prediction.runtime import (
    BackendModel,
    for_prediction,
    load_window_model,
    with_inference,
)
from landcover.prediction.setup import (
    GDAL_CACHE_BYTES,
    FreedMemory,
    block_cache_bytes,
    check_model,
    check_sources_fit,
    open_images,
    warnings_to_log,
    window_overlap,
)
from landcover.prediction.tta import tta_ops
from landcover.prediction.windows import WindowRunner
from tiling.reader import RasterReader
from tiling.shared.urls import check_storage_options

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
        urls = [config.model, *config.images, outputs.out, outputs.probabilities or ""]
        check_storage_options([u for u in urls if u], config.storage_options)
        if rank != 0:
            config = replace(config, progress=False)
        tta_ops(config.tta)  # refuse a bad mode before the model loads
        device = torch_device(config.device, error=PredictionError)
        FreedMemory().reuse()  # before the model loads (see FreedMemory)
        with (
            _hold_outputs(outputs, rank),
            rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"),
        ):
            grid, plan, tally = _predict_and_write(
                config, outputs, device, rank, world_size, local_ranks
            )
    result = PredictResult(
        out=outputs.out,
        probabilities=outputs.probabilities,
        grid=grid,
        sources=tuple(s.path for s in plan.sources),
        windows=tally.windows,
        valid_pixels=int(tally.class_pixels[1:].sum()),
        class_pixels=tuple(int(v) for v in tally.class_pixels),
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
) -> tuple[OutputGrid, GridPlan, _Tally]:
    model, meta = load_window_model(
        config.model,
        backend=config.backend,
        precision=config.precision,
        device=device,
        storage_options=config.storage_options,
    )
    check_model(config.model, meta)
    overlap = window_overlap(config.overlap_px, meta.chip_size)
    sources = open_images(
        config.images,
        storage_options=config.storage_options,
        zero_is_nodata=config.zero_is_nodata,
    )
    check_sources_fit(sources, meta, config.model)
    plan = plan_output_grid(
        sources,
        config.region,
        resolution_m=meta.resolution_m,
        crs=None if config.dst_crs is None else parse_crs(config.dst_crs, what="--dst-crs"),
        resolution=config.resolution,
        max_pixels=config.max_pixels,
        quiet=rank != 0,  # rank 0 speaks for the job
    )
    grid = plan.grid
    logger.info(
        "predicting %d x %d px at %g in %s from %d of %d images",
        grid.width,
        grid.height,
        grid.resolution,
        grid.crs.to_string(),
        len(plan.sources),
        len(sources),
    )
    layout = WindowLayout.over(grid.height, grid.width, size=meta.chip_size, overlap=overlap)
    if plan.region is not None and not region_has_pixels(plan, config.block_px):
        raise RegionError(
            f"region covers no pixel centre of the images at {grid.resolution:g} "
            "units/px after masking; give a larger region or a finer --resolution"
        )
    # `auto` decided from the whole grid, alike on every rank; parts record what runs
    model = for_prediction(model, layout.num_windows * layout.size**2)
    config = with_inference(config, model)
    if world_size > 1:
        run = RankRun(
            config,
            plan,
            layout,
            meta.num_classes,
            device.type,
            outputs,
            rank,
            world_size,
            local_ranks,
        )
        windows, class_pixels = run_rank(
            run,
            lambda share, tiles_out, tiles_prob: _predict_into(
                model, meta, plan, layout, config, device, share, tiles_out, tiles_prob
            ),
        )
        return grid, plan, _Tally(class_pixels, windows)
    with TempOutputs(outputs, config.storage_options) as temps:
        share = whole_grid(grid)
        tally = _predict_into(
            model, meta, plan, layout, config, device, share, temps.tiles_out, temps.tiles_prob
        )
        require_predicted_pixels(tally.class_pixels)
        write_cogs(temps, temps.tiles_out, temps.tiles_prob)
        temps.commit()
    return grid, plan, tally


@dataclass(slots=True)
class _Tally:
    class_pixels: npt.NDArray[np.int64]
    windows: int = 0


def _predict_into(
    model: BackendModel,
    meta: ModelMeta,
    plan: GridPlan,
    layout: WindowLayout,
    config: PredictConfig,
    device: torch.device,
    share: RankShare,
    tiles_out: str,
    tiles_prob: str | None,
) -> _Tally:
    """Predict the blocks of `share` (whole block rows) into tiled GeoTIFFs of its rows;
    reading, inference and writing overlap (`landcover.prediction.pipeline`)."""
    grid = plan.grid
    windows = WindowRunner(
        model,
        meta,
        layout,
        batch_size=config.batch_size,
        where=config.model,
        device=device,
        tta_ops=tta_ops(config.tta),
    )
    show = config.progress if config.progress is not None else sys.stderr.isatty()
    with ExitStack() as stack:
        target = share.grid(grid)
        out_bands = 1 + (meta.num_classes - 1 if tiles_prob is not None else 0)
        cache = block_cache_bytes(
            config.block_px, target.width, out_bands, in_bands=meta.in_channels
        )
        stack.enter_context(rasterio.Env(GDAL_CACHEMAX=cache))
        dst = stack.enter_context(rasterio.open(tiles_out, "w", **class_profile(target)))
        describe_class_raster(dst, meta, sources=[s.path for s in plan.sources])
        dst.update_tags(**model.inference.tags())  # what ran: backend, precision, provider
        prob = None
        if tiles_prob is not None:
            profile = probability_profile(target, meta)
            prob = stack.enter_context(rasterio.open(tiles_prob, "w", **profile))
            describe_probability_raster(prob, meta)
        schedule = block_schedule(layout, share.window(grid), config.block_px)
        bar = stack.enter_context(
            tqdm(
                total=sum(block.owned_windows for block in schedule),
                unit="window",
                disable=not show,
                desc="predict",
            )
        )
        reader = RasterReader(storage_options=config.storage_options)
        stack.callback(reader.close)
        predictor = BlockPredictor(
            windows, meta.num_classes, device=device, probabilities=prob is not None
        )
        writer = BlockWriter(dst, prob, meta.num_classes, target=share.window(grid))
        memory = FreedMemory()

        def predict(prepared: PreparedBlock) -> PredictedBlock:
            bar.update(prepared.block.owned_windows)
            predicted = predictor(prepared)
            if prepared.todo:
                memory.release()  # the block's logits and activations are free by now
            return predicted

        # The pipeline's threads have stopped when it returns or raises: the files and the
        # reader are closed after them.
        run_pipeline(
            schedule,
            partial(prepare_block, plan, layout, reader),
            predict,
            writer,
            threaded=config.pipeline,
        )
    return _Tally(writer.class_pixels, windows.windows_run)
