"""A prediction made ready to run: the one setup of the one-COG runner, its ranks and the
tiles of a tiled product.

`prepare_prediction(config, device, ...)` loads the model, checks it against the images,
plans the output grid and lays the model's windows over it, then settles what runs the model
(`auto` decided from the whole grid, alike in every rank, tile and task). It returns a frozen
`PreparedPrediction`, the one value that the window-into-file loop
(`landcover.prediction.intofile`) and the keys of parts and tiles
(`landcover.prediction.distributed.pixel_settings`) read.

Where later steps plug in (each once, here, so that every rank, tile and task of a job sees
the same result and the maps stay identical whichever of them runs a pixel):
- a chosen window size (`--window auto`): the `WindowLayout` is made in `_window_layout`
  and nowhere else;
- test-time adaptation (statistics computed once from the images, then a changed model:
  `landcover.prediction.adapt.adapt_prediction`): `prepare_prediction` calls it after the
  grid and the layout are planned (the statistics read the plan's images) and before
  `for_prediction` (so `auto` chooses the backend for the adapted model, and
  `with_inference` records what ran).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from landcover.devices import torch_device
from landcover.errors import PredictionError, RegionError
from landcover.models.modelfile import ModelMeta
from landcover.prediction.adapt import adapt_prediction
from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import region_has_pixels, resolve_block_px
from landcover.prediction.config import PredictConfig
from landcover.prediction.outgrid import GridPlan, OutputGrid, plan_output_grid
from landcover.prediction.region import parse_crs
from landcover.prediction.runtime import (
    BackendModel,
    for_prediction,
    load_window_model,
    with_inference,
)
from landcover.prediction.setup import (
    FreedMemory,
    check_model,
    check_sources_fit,
    open_images,
)
from landcover.prediction.tta import tta_ops
from landcover.prediction.windows import choose_overlap_px, choose_window_px
from tiling.sources.rasters import RasterInfo

__all__ = ["PreparedPrediction", "prediction_device", "prepare_prediction"]


@dataclass(frozen=True, slots=True)
class PreparedPrediction:
    """Everything the window-into-file loop needs, made once per process and run.

    `config.backend` and `config.precision` are what runs `model` (`auto` resolved), so
    a part's or tile's key records what ran. `sources` are every image given; `plan.sources`
    those the grid reads."""

    config: PredictConfig
    model: BackendModel
    meta: ModelMeta
    device: torch.device
    sources: tuple[RasterInfo, ...]
    plan: GridPlan
    layout: WindowLayout

    @property
    def grid(self) -> OutputGrid:
        """The output grid."""
        return self.plan.grid


def prediction_device(config: PredictConfig) -> torch.device:
    """The device of `config`, after the checks that read no file (the TTA mode, the
    device); readies malloc for the model (`FreedMemory.reuse`, before the model loads).
    The one-COG runner calls it before it takes the output's lock, so that a bad option
    fails first."""
    tta_ops(config.tta)  # refuse a bad mode before the model loads
    device = torch_device(config.device, error=PredictionError)
    FreedMemory().reuse()
    return device


def prepare_prediction(
    config: PredictConfig, device: torch.device, *, max_pixels: int | None, quiet: bool
) -> PreparedPrediction:
    """Load and check the model, open and check the images, plan the output grid and its
    windows, and settle what runs the model (see the module docstring for where later steps
    plug in). `max_pixels`: the largest grid accepted (`config.max_pixels` for one COG; a
    tiled product checks its tiles instead). `quiet`: leave the grid's warnings to another
    process of the job (rank 0 speaks for it).

    Raises `PredictionError` for a model or images that cannot make a map, `RegionError`
    for a region without a pixel of the images."""
    model, meta = load_window_model(
        config.model,
        backend=config.backend,
        precision=config.precision,
        device=device,
        storage_options=config.storage_options,
        calibration=config.calibration,  # int8: the chip store, read and quantized once
    )
    check_model(config.model, meta)
    # The overlap at the chip, for the layout that `--backend auto` sizes the backend by (an
    # explicit one that only a larger --window holds, cut to the chip); the window's is below.
    overlap = choose_overlap_px(
        None if config.overlap_px is None else min(config.overlap_px, meta.chip_size // 2),
        meta.architecture,
        chip_px=meta.chip_size,
        window_px=meta.chip_size,
    )
    sources = open_images(
        config.images, storage_options=config.storage_options, zero_is_nodata=config.zero_is_nodata
    )
    check_sources_fit(sources, meta, config.model)
    plan = plan_output_grid(
        sources,
        config.region,
        resolution_m=meta.resolution_m,
        crs=None if config.dst_crs is None else parse_crs(config.dst_crs, what="--dst-crs"),
        resolution=config.resolution,
        max_pixels=max_pixels,
        quiet=quiet,
    )
    layout = _window_layout(plan.grid, meta, overlap)
    # --block-px auto: from the model and the device (the chip's windows, which hold the most
    # logits a pixel), alike on every rank, tile and task; what follows reads the number
    block_px = resolve_block_px(
        config.block_px,
        num_classes=meta.num_classes,
        layout=layout,
        probabilities=config.probabilities is not None,
        on_cpu=device.type == "cpu",
    )
    config = replace(config, block_px=block_px)
    if plan.region is not None and not region_has_pixels(plan, block_px):
        raise RegionError(
            f"region covers no pixel centre of the images at {plan.grid.resolution:g} "
            "units/px after masking; give a larger region or a finer --resolution"
        )
    # Test-time adaptation (`--adapt`): statistics of the images, computed once from the
    # whole grid, so the same on every rank, tile and task; the config then carries their digest
    config, model, meta = adapt_prediction(config, model, meta, plan, device)
    # `auto` is decided from the whole grid, alike on every rank, tile and task.
    chosen = for_prediction(model, layout.num_windows * layout.size**2)
    if chosen is not model:  # the torch model onnxruntime replaces: its pages back to the OS
        del model
        FreedMemory().hand_back()
    model = chosen
    # --window: for what runs the model now, from the whole grid (alike everywhere too)
    window_px = choose_window_px(
        config.window,
        model,
        chip_px=meta.chip_size,
        overlap_px=config.overlap_px,
        architecture=meta.architecture,
        grid_px=(plan.grid.height, plan.grid.width),
    )
    overlap = choose_overlap_px(
        config.overlap_px, meta.architecture, chip_px=meta.chip_size, window_px=window_px
    )
    if (window_px, overlap) != (layout.size, layout.overlap):
        layout = WindowLayout.over(
            plan.grid.height, plan.grid.width, size=window_px, overlap=overlap
        )
    return PreparedPrediction(
        with_inference(config, model), model, meta, device, tuple(sources), plan, layout
    )


def _window_layout(grid: OutputGrid, meta: ModelMeta, overlap: int) -> WindowLayout:
    """The model's windows over `grid`: the model's chip, `overlap` px apart from their
    neighbours. The one place a chosen window size would enter."""
    return WindowLayout.over(grid.height, grid.width, size=meta.chip_size, overlap=overlap)
