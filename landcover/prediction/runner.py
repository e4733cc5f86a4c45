"""Predict a land-cover map for a region: region → windows → blended logits → COG.

The output grid is cut into blocks (`block_px` square). For each block we read the source
pixels under every window that touches it, run those windows in batches, blend their logits
with a smooth weight (`landcover.prediction.blend`) and write the block's classes into a
tiled GeoTIFF.
Memory is bounded by one block, never by the region: the logits of windows that reach into the
next block of the same block row are kept for it, and windows on the boundary between two
block rows are run once for each (about 12% more inference with 2048 px blocks and 256 px
windows) rather than keeping a region-wide strip of logits. The tiled GeoTIFF then becomes a
Cloud-Optimized GeoTIFF (GDAL's COG driver, overviews by mode) under a temporary name that is
renamed into place at the end.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from rasterio.features import rasterize
from rasterio.windows import Window
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry
from torch import nn
from tqdm import tqdm

from landcover.classes import NODATA_CODE
from landcover.data.shards import normalise
from landcover.errors import PredictionError, RegionError
from landcover.models.modelfile import ModelMeta, load_model_file
from landcover.prediction.blend import LogitBlender, WindowLayout
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.outfiles import (
    PROBABILITY_NODATA,
    PROBABILITY_SCALE,
    OutputPaths,
    TempOutputs,
    check_outputs,
    class_profile,
    describe_class_raster,
    describe_probability_raster,
    probability_profile,
    to_cog,
)
from landcover.prediction.outgrid import (
    DEFAULT_MAX_PIXELS,
    GridPlan,
    OutputGrid,
    plan_output_grid,
)
from landcover.prediction.region import Region, parse_crs
from landcover.prediction.setup import (
    check_model,
    check_sources_fit,
    keep_large_buffers_off_the_heap,
    open_images,
    resolve_device,
    warnings_to_log,
    window_overlap,
)
from tiling.sources import RasterReader
from tiling.urls import check_storage_options

logger = logging.getLogger(__name__)

# GDAL's block cache defaults to 5% of RAM and would grow with the region while writing:
# cap it so memory stays flat (tiles are written once, in order, so a cache barely helps).
GDAL_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PredictConfig:
    """Everything `predict_region` needs; built by the CLI."""

    model: str
    images: tuple[str, ...]
    out: str
    region: Region | None = None
    dst_crs: str | None = None
    resolution: float | None = None  # in units of the output CRS; None: the model's
    overlap_px: int | None = None  # None: a quarter of the model's chip size
    batch_size: int = 16
    device: str = "cpu"
    probabilities: str | None = None
    overwrite: bool = False
    block_px: int = 2048
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    progress: bool | None = None  # None: a progress bar when stderr is a terminal
    max_pixels: int | None = DEFAULT_MAX_PIXELS  # refuse larger output grids; None: no limit
    # Images without nodata or a mask: pixels 0 in every band are nodata (NAIP collars).
    zero_is_nodata: bool = True


@dataclass(frozen=True, slots=True)
class PredictResult:
    out: str
    probabilities: str | None
    grid: OutputGrid
    sources: tuple[str, ...]
    windows: int  # windows run (those between two block rows run once for each)
    valid_pixels: int
    class_pixels: tuple[int, ...]  # per class code, code 0 = outside the region / no data
    elapsed_s: float


def predict_region(config: PredictConfig) -> PredictResult:
    """Predict `config.region` (or the union of the images) and write `config.out` as a COG."""
    started = time.perf_counter()
    with warnings_to_log():
        outputs = check_outputs(config.out, config.probabilities, overwrite=config.overwrite)
        check_storage_options([config.model, *config.images], config.storage_options)
        if config.batch_size < 1:
            raise PredictionError(f"--batch-size {config.batch_size}: must be at least 1")
        if config.block_px < 16:
            raise PredictionError(f"--block-size {config.block_px} px: must be at least 16")
        device = resolve_device(config.device)
        keep_large_buffers_off_the_heap()
        with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"):
            grid, plan, tally = _predict_and_write(config, outputs, device)
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
    logger.info(
        "wrote %s (%d valid px, %d windows, %.1f s)",
        result.out,
        result.valid_pixels,
        result.windows,
        result.elapsed_s,
    )
    return result


def _predict_and_write(
    config: PredictConfig, outputs: OutputPaths, device: torch.device
) -> tuple[OutputGrid, GridPlan, _Tally]:
    model, meta = load_model_file(
        config.model, device=device, storage_options=config.storage_options
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
    if plan.region is not None and not _region_has_pixels(plan, config.block_px):
        raise RegionError(
            f"region covers no pixel centre of the images at {grid.resolution:g} "
            "units/px after masking; give a larger region or a finer --resolution"
        )
    with TempOutputs(outputs) as temps:
        tally = _predict_into(
            model, meta, plan, layout, config, device, temps.tiles_out, temps.tiles_prob
        )
        if tally.class_pixels[1:].sum() == 0:
            raise RegionError(
                "no image pixel with data inside the region (all nodata after masking); "
                "check the region and the images' nodata"
            )
        to_cog(temps.tiles_out, temps.cog_out, resampling="MODE")
        if temps.tiles_prob is not None and temps.cog_prob is not None:
            to_cog(temps.tiles_prob, temps.cog_prob, resampling="AVERAGE")
        temps.commit()
    return grid, plan, tally


@dataclass(slots=True)
class _Tally:
    class_pixels: npt.NDArray[np.int64]
    windows: int = 0


def _predict_into(
    model: nn.Module,
    meta: ModelMeta,
    plan: GridPlan,
    layout: WindowLayout,
    config: PredictConfig,
    device: torch.device,
    tiles_out: str,
    tiles_prob: str | None,
) -> _Tally:
    grid = plan.grid
    num_classes = meta.num_classes
    tally = _Tally(np.zeros(num_classes, dtype=np.int64))
    windows = _WindowRunner(model, meta, layout, config, device)
    show = config.progress if config.progress is not None else sys.stderr.isatty()
    with ExitStack() as stack:
        dst = stack.enter_context(rasterio.open(tiles_out, "w", **class_profile(grid)))
        describe_class_raster(dst, meta)
        prob = None
        if tiles_prob is not None:
            profile = probability_profile(grid, meta)
            prob = stack.enter_context(rasterio.open(tiles_prob, "w", **profile))
            describe_probability_raster(prob, meta)
        bar = stack.enter_context(
            tqdm(total=layout.num_windows, unit="window", disable=not show, desc="predict")
        )
        reader = RasterReader(storage_options=config.storage_options)
        stack.callback(reader.close)
        for row0, col0, height, width in _blocks(grid, config.block_px):
            if col0 == 0:
                windows.new_block_row()
            rows = layout.rows_touching(row0, row0 + height)
            cols = layout.cols_touching(col0, col0 + width)
            bar.update(_owned_windows(layout, rows, cols, row0, col0, height, width))
            if not plan.area.intersects(box(*grid.window_bounds(row0, col0, height, width))):
                # Nothing to predict: leave the tiles unwritten (sparse, read as nodata).
                tally.class_pixels[NODATA_CODE] += height * width
                continue
            ext_row0, ext_col0 = rows[0], cols[0]
            ext_h, ext_w = rows[-1] + layout.size - ext_row0, cols[-1] + layout.size - ext_col0
            data, covered = read_mosaic(plan, reader, ext_row0, ext_col0, ext_h, ext_w)
            crop = (
                slice(row0 - ext_row0, row0 - ext_row0 + height),
                slice(col0 - ext_col0, col0 - ext_col0 + width),
            )
            inside = covered[crop]
            if plan.region is not None:
                inside = inside & _region_mask(plan.region, grid, row0, col0, height, width)
            # Only windows that touch an output pixel of this block are run.
            todo = [
                (r, c)
                for r in rows
                for c in cols
                if inside[
                    max(r - row0, 0) : r - row0 + layout.size,
                    max(c - col0, 0) : c - col0 + layout.size,
                ].any()
            ]
            classes = np.zeros((height, width), dtype=np.uint8)
            probs = None
            if todo:
                blender = LogitBlender(
                    layout, num_classes, row0, col0, height, width, device=device
                )
                block = _Block(data, covered, ext_row0, ext_col0, row0, col0, height, width)
                windows.run(block, todo, blender)
                blended = blender.blended()[1:]  # code 0 (nodata) is never predicted
                inside_t = torch.from_numpy(inside).to(device)
                codes = (blended.argmax(dim=0) + 1).to(torch.uint8)
                codes = torch.where(inside_t, codes, torch.zeros_like(codes))
                classes = codes.cpu().numpy()
                if prob is not None:
                    p = (
                        torch.softmax(blended, dim=0)
                        .mul_(PROBABILITY_SCALE)
                        .round_()
                        .to(torch.uint8)
                    )
                    p = torch.where(inside_t, p, torch.full_like(p, PROBABILITY_NODATA))
                    probs = p.cpu().numpy()
            tally.class_pixels += np.bincount(classes.ravel(), minlength=num_classes)[:num_classes]
            window = Window(col0, row0, width, height)
            dst.write(classes, 1, window=window)
            if prob is not None:
                if probs is None:
                    probs = np.full((num_classes - 1, height, width), PROBABILITY_NODATA, np.uint8)
                prob.write(probs, window=window)
    tally.windows = windows.windows_run
    return tally


@dataclass(frozen=True, slots=True)
class _Block:
    """Source pixels under all windows of one output block, and the block's place."""

    data: npt.NDArray[np.uint8]  # (bands, h, w) from (ext_row0, ext_col0)
    covered: npt.NDArray[np.bool_]
    ext_row0: int
    ext_col0: int
    row0: int
    col0: int
    height: int
    width: int


class _WindowRunner:
    """Runs windows in batches; keeps the logits of windows that reach into the next block of
    the same block row, so only windows on the boundary to the next block ROW run twice."""

    def __init__(
        self,
        model: nn.Module,
        meta: ModelMeta,
        layout: WindowLayout,
        config: PredictConfig,
        device: torch.device,
    ) -> None:
        self.model, self.layout, self.device = model, layout, device
        self.num_classes = meta.num_classes
        self.batch_size = config.batch_size
        self.where = config.model
        self.mean = torch.tensor(meta.band_mean, dtype=torch.float32, device=device).view(
            1, -1, 1, 1
        )
        self.std = torch.tensor(meta.band_std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.carry: dict[tuple[int, int], torch.Tensor] = {}
        self.windows_run = 0

    def new_block_row(self) -> None:
        self.carry = {}

    def run(self, block: _Block, todo: Sequence[tuple[int, int]], blender: LogitBlender) -> None:
        size = self.layout.size
        right_edge = block.col0 + block.width
        carried, self.carry = self.carry, {}
        fresh = [rc for rc in todo if rc not in carried]
        pixels = torch.from_numpy(block.data).to(self.device)
        has_data = torch.from_numpy(block.covered).to(self.device)
        results: list[tuple[tuple[int, int], torch.Tensor]] = [
            (rc, carried[rc]) for rc in todo if rc in carried
        ]
        for batch in _batches(fresh, self.batch_size):
            spans = [
                (
                    slice(r - block.ext_row0, r - block.ext_row0 + size),
                    slice(c - block.ext_col0, c - block.ext_col0 + size),
                )
                for r, c in batch
            ]
            x = torch.stack([pixels[:, rs, cs] for rs, cs in spans])
            m = torch.stack([has_data[rs, cs] for rs, cs in spans])
            # As in training: pixels no source covers get the band mean (0 after normalising).
            x = normalise(x, self.mean, self.std, valid=m)
            logits = _run_model(self.model, x, self.num_classes, self.where)
            results.extend(zip(batch, logits, strict=True))
            self.windows_run += len(batch)
        for (r, c), window_logits in results:
            blender.add(window_logits, r, c)
            if c + size > right_edge and right_edge < self.layout.width:
                self.carry[(r, c)] = window_logits


def _run_model(model: nn.Module, x: torch.Tensor, num_classes: int, where: str) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(x)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 4 or logits.shape[1] != num_classes:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise PredictionError(
            f"{where}: model returned {shape} for {tuple(x.shape)} input; expected "
            f"{num_classes} class channels as its class table says"
        )
    if logits.shape[-2:] != x.shape[-2:]:
        raise PredictionError(
            f"{where}: model output is {tuple(logits.shape[-2:])} px for a "
            f"{tuple(x.shape[-2:])} px window; it must keep the input size"
        )
    return logits.float()


def _owned_windows(
    layout: WindowLayout,
    rows: Sequence[int],
    cols: Sequence[int],
    row0: int,
    col0: int,
    height: int,
    width: int,
) -> int:
    half = layout.size // 2
    own_rows = sum(1 for r in rows if row0 <= min(r + half, layout.height - 1) < row0 + height)
    own_cols = sum(1 for c in cols if col0 <= min(c + half, layout.width - 1) < col0 + width)
    return own_rows * own_cols


def _blocks(grid: OutputGrid, block_px: int) -> Iterator[tuple[int, int, int, int]]:
    for row0 in range(0, grid.height, block_px):
        for col0 in range(0, grid.width, block_px):
            yield row0, col0, min(block_px, grid.height - row0), min(block_px, grid.width - col0)


def _batches(items: list[tuple[int, int]], size: int) -> Iterator[list[tuple[int, int]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _region_mask(
    geometry: BaseGeometry, grid: OutputGrid, row0: int, col0: int, height: int, width: int
) -> npt.NDArray[np.bool_]:
    mask = rasterize(
        [(geometry, 1)],
        out_shape=(height, width),
        transform=grid.window_transform(row0, col0),
        fill=0,
        dtype="uint8",
        all_touched=False,  # a pixel is inside when its centre is
    )
    return np.asarray(mask, dtype=bool)


def _region_has_pixels(plan: GridPlan, block_px: int) -> bool:
    """Whether any pixel centre lies in region ∩ images (rasterizing only, no reads)."""
    for row0, col0, height, width in _blocks(plan.grid, block_px):
        if not plan.area.intersects(box(*plan.grid.window_bounds(row0, col0, height, width))):
            continue
        if _region_mask(plan.area, plan.grid, row0, col0, height, width).any():
            return True
    return False
