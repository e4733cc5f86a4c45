"""Predict a land-cover map for a region: region → windows → blended logits → COG.

The output grid is cut into blocks (`block_px` square). For each block we read the source
pixels under every window that touches it, run those windows in batches, blend their logits
with a smooth weight (`landcover.blend`) and write the block's classes into a tiled GeoTIFF.
Memory is bounded by one block, never by the region: the logits of windows that reach into the
next block of the same block row are kept for it, and windows on the boundary between two
block rows are run once for each (about 12% more inference with 2048 px blocks and 256 px
windows) rather than keeping a region-wide strip of logits. The tiled GeoTIFF then becomes a
Cloud-Optimized GeoTIFF (GDAL's COG driver, overviews by mode) under a temporary name that is
renamed into place at the end.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.shutil
import torch
from rasterio.features import rasterize
from rasterio.windows import Window
from shapely.geometry import box
from shapely.geometry.base import BaseGeometry
from torch import nn
from tqdm import tqdm

from landcover.blend import LogitBlender, WindowLayout
from landcover.classes import NODATA_CODE, colormap
from landcover.data import normalise
from landcover.errors import LandcoverError, OutputExistsError, PredictionError, RegionError
from landcover.modelfile import ModelMeta, load_model_file
from landcover.outgrid import (
    TAG_CLASS_MAP,
    TAG_CLASS_NAMES,
    TAG_MODEL,
    GridPlan,
    OutputGrid,
    plan_output_grid,
    read_mosaic,
)
from landcover.region import Region, parse_crs
from tiling.sources import RasterInfo, RasterReader, expand_inputs, open_image

logger = logging.getLogger(__name__)

# Probabilities are stored as round(p * 254); 255 marks pixels outside the region.
PROBABILITY_SCALE = 254
PROBABILITY_NODATA = 255
# GDAL's block cache defaults to 5% of RAM and would grow with the region while writing:
# cap it so memory stays flat (tiles are written once, in order, so a cache barely helps).
GDAL_CACHE_BYTES = 64 * 1024 * 1024
COG_BLOCK_PX = 512
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


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
    outputs = _check_outputs(config)
    device = resolve_device(config.device)
    _keep_large_buffers_off_the_heap()
    if config.batch_size < 1:
        raise PredictionError(f"--batch-size {config.batch_size}: must be at least 1")
    if config.block_px < 16:
        raise PredictionError(f"--block-size {config.block_px} px: must be at least 16")
    with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"):
        model, meta = load_model_file(
            config.model, device=device, storage_options=config.storage_options
        )
        _check_model(config.model, meta)
        overlap = _overlap(config.overlap_px, meta.chip_size)
        sources = open_images(config.images, storage_options=config.storage_options)
        _check_sources_fit(sources, meta, config.model)
        plan = plan_output_grid(
            sources,
            config.region,
            resolution_m=meta.resolution_m,
            crs=None if config.dst_crs is None else parse_crs(config.dst_crs, what="--dst-crs"),
            resolution=config.resolution,
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
        with ExitStack() as stack:
            temps = _TempFiles(outputs)
            stack.callback(temps.remove_all)
            tally = _predict_into(
                model, meta, plan, layout, config, device, temps.tiles_out, temps.tiles_prob
            )
            if tally.class_pixels[1:].sum() == 0:
                raise RegionError(
                    "no image pixel with data inside the region (all nodata after masking); "
                    "check the region and the images' nodata"
                )
            _to_cog(temps.tiles_out, temps.cog_out, resampling="MODE")
            if temps.tiles_prob is not None and temps.cog_prob is not None:
                _to_cog(temps.tiles_prob, temps.cog_prob, resampling="AVERAGE")
            temps.commit()
    result = PredictResult(
        out=outputs[0],
        probabilities=outputs[1],
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


def _keep_large_buffers_off_the_heap() -> None:
    """Serve allocations over 1 MiB with mmap, so freed block buffers go back to the OS.

    glibc raises its mmap threshold each time a large block is freed, after which the
    per-block tensors and arrays come from the heap, fragment it, and RSS creeps up with the
    number of blocks (measured: +25% over 64 blocks). Fixing the threshold keeps it flat.
    Process-wide and idempotent; a no-op where there is no glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, 1024 * 1024)
    except (OSError, AttributeError):
        return


def open_images(
    images: Sequence[str], *, storage_options: Mapping[str, Any] | None = None
) -> list[RasterInfo]:
    """Expand paths/globs/URLs and validate each image (4-band uint8, georeferenced)."""
    paths = expand_inputs(images, storage_options=storage_options, what="image")
    return [open_image(path, storage_options=storage_options) for path in paths]


def resolve_device(text: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`, `mps` or `auto` (CUDA when there is one)."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise PredictionError(
            f"--device {text!r} is not a device; use cpu, cuda, cuda:0 or auto"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PredictionError(f"--device {text}: no CUDA device here; use --device cpu")
    if (
        device.type == "cuda"
        and device.index is not None
        and device.index >= torch.cuda.device_count()
    ):
        raise PredictionError(
            f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) here"
        )
    return device


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
        dst = stack.enter_context(rasterio.open(tiles_out, "w", **_class_profile(grid)))
        _describe_class_raster(dst, meta)
        prob = None
        if tiles_prob is not None:
            prob = stack.enter_context(rasterio.open(tiles_prob, "w", **_prob_profile(grid, meta)))
            _describe_probability_raster(prob, meta)
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


def _overlap(overlap_px: int | None, chip_size: int) -> int:
    overlap = chip_size // 4 if overlap_px is None else overlap_px
    if not 0 <= overlap <= chip_size // 2:
        raise PredictionError(
            f"--overlap {overlap}: must be between 0 and {chip_size // 2} px "
            f"(half the model's {chip_size} px window)"
        )
    return overlap


def _check_model(where: str, meta: ModelMeta) -> None:
    bands = meta.in_channels
    if len(meta.band_mean) != bands or len(meta.band_std) != bands:
        raise PredictionError(
            f"{where}: band statistics for {len(meta.band_mean)} bands but the model takes "
            f"{bands}; the model file is damaged, re-export it"
        )
    if any(not s > 0 for s in meta.band_std):
        raise PredictionError(f"{where}: band std {list(meta.band_std)} must be > 0")
    if not 2 <= meta.num_classes <= 255:
        raise PredictionError(
            f"{where}: class table {meta.class_map.name!r} has {meta.num_classes} codes; a "
            "land-cover raster (uint8, 0 = nodata) holds 2..255"
        )
    if meta.chip_size < 8:
        raise PredictionError(f"{where}: chip size {meta.chip_size} px is too small to predict")


def _check_sources_fit(sources: Sequence[RasterInfo], meta: ModelMeta, model: str) -> None:
    for s in sources:
        if s.count != meta.in_channels:
            raise PredictionError(
                f"{s.path}: has {s.count} bands but model {model} expects {meta.in_channels} "
                f"({', '.join(meta.band_names)}); use images with those bands"
            )


def _check_outputs(config: PredictConfig) -> tuple[str, str | None]:
    paths = [config.out] + ([config.probabilities] if config.probabilities else [])
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            raise PredictionError(
                f"{path}: outputs are written to a local path; write locally, then upload"
            )
        if Path(path).is_dir():
            raise PredictionError(f"{path} is a directory; give a file name like lc.tif")
        if Path(path).exists() and not config.overwrite:
            raise OutputExistsError(f"{path} exists; pass --overwrite to replace it")
    if config.probabilities and Path(config.probabilities).resolve() == Path(config.out).resolve():
        raise PredictionError("--probabilities must name a different file than --out")
    return config.out, config.probabilities


class _TempFiles:
    """Temp names beside each output; `commit` renames the COGs into place, else all go."""

    def __init__(self, outputs: tuple[str, str | None]) -> None:
        token = uuid.uuid4().hex[:8]
        out, prob = outputs
        self.out, self.prob = out, prob
        self.tiles_out = _temp_name(out, token, "tiles")
        self.cog_out = _temp_name(out, token, "cog")
        self.tiles_prob = None if prob is None else _temp_name(prob, token, "tiles")
        self.cog_prob = None if prob is None else _temp_name(prob, token, "cog")
        for path in (out, prob):
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)

    def commit(self) -> None:
        # The probabilities first: the class map appearing is the sign that the run finished.
        if self.prob is not None and self.cog_prob is not None:
            os.replace(self.cog_prob, self.prob)
        os.replace(self.cog_out, self.out)

    def remove_all(self) -> None:
        for path in (self.tiles_out, self.cog_out, self.tiles_prob, self.cog_prob):
            if path is not None:
                Path(path).unlink(missing_ok=True)
                Path(path + ".aux.xml").unlink(missing_ok=True)


def _temp_name(path: str, token: str, kind: str) -> str:
    target = Path(path)
    return str(target.parent / f".{target.name}.{token}.{kind}.part.tif")


def _class_profile(grid: OutputGrid) -> dict[str, Any]:
    return {
        "driver": "GTiff",
        "width": grid.width,
        "height": grid.height,
        "count": 1,
        "dtype": "uint8",
        "crs": grid.crs,
        "transform": grid.transform,
        "nodata": NODATA_CODE,
        "tiled": True,
        "blockxsize": COG_BLOCK_PX,
        "blockysize": COG_BLOCK_PX,
        "compress": "deflate",
        "zlevel": 1,  # an intermediate file: speed over size
        "bigtiff": "if_safer",
        "sparse_ok": True,  # blocks outside the region are never written: they read as nodata
    }


def _prob_profile(grid: OutputGrid, meta: ModelMeta) -> dict[str, Any]:
    profile = _class_profile(grid)
    profile.update(count=meta.num_classes - 1, nodata=PROBABILITY_NODATA, interleave="pixel")
    return profile


def _describe_class_raster(dst: Any, meta: ModelMeta) -> None:
    dst.write_colormap(1, colormap(meta.class_map))
    dst.set_band_description(1, "land cover class")
    dst.update_tags(**_class_tags(meta))


def _describe_probability_raster(dst: Any, meta: ModelMeta) -> None:
    for code, name in enumerate(meta.class_map.class_names[1:], start=1):
        dst.set_band_description(code, f"p({name})")
    dst.scales = tuple(1 / PROBABILITY_SCALE for _ in range(meta.num_classes - 1))
    dst.offsets = tuple(0.0 for _ in range(meta.num_classes - 1))
    dst.update_tags(**_class_tags(meta))


def _class_tags(meta: ModelMeta) -> dict[str, str]:
    return {
        TAG_CLASS_MAP: json.dumps(meta.class_map.to_json(), separators=(",", ":")),
        TAG_CLASS_NAMES: json.dumps(meta.class_map.class_names),
        TAG_MODEL: meta.architecture,
    }


def _to_cog(src: str, dst: str, *, resampling: str) -> None:
    try:
        rasterio.shutil.copy(
            src,
            dst,
            driver="COG",
            COMPRESS="DEFLATE",
            BLOCKSIZE=COG_BLOCK_PX,
            OVERVIEW_RESAMPLING=resampling,
            BIGTIFF="IF_SAFER",
            NUM_THREADS="ALL_CPUS",
            SPARSE_OK="TRUE",
        )
    except rasterio.errors.RasterioIOError as exc:
        raise LandcoverError(f"{dst}: could not write the COG ({exc})".splitlines()[0]) from None
