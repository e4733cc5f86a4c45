"""The plan of a tiled map product (`landcover.prediction.tiled`): the model, the output grid,
the lattice tiles with work in it, what each costs, which images each reads, and each tile's
key; and the checks of a tiled `--out`, made before any work."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from landcover.devices import torch_device
from landcover.errors import PredictionError, RegionError
from landcover.models.modelfile import ModelMeta
from landcover.outputs import check_can_create_in
from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import region_has_pixels
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import RankRun
from landcover.prediction.maptiles import MapTile, map_tiles, tile_costs
from landcover.prediction.outfiles import (
    OutputPaths,
)
from landcover.prediction.outgrid import GridPlan, plan_output_grid
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
    window_overlap,
)
from landcover.prediction.tilerecords import tile_key
from landcover.prediction.tta import tta_ops
from tiling.shared.fingerprint import fingerprint, fingerprints
from tiling.shared.urls import check_storage_options, is_local, local_path
from tiling.stacquery import StacSource

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TiledSetup:
    """What predicting tiles of a product needs (picklable: a Dask task's argument):
    the prediction's options, `config.out` being the product's directory, the tile edge in
    pixels, and the STAC items the images came from (their dates and links go into the
    items of the tiles that read them)."""

    config: PredictConfig
    tile_px: int
    stac_sources: tuple[StacSource, ...] = ()

    def __post_init__(self) -> None:
        # the tile size is the config's field, checked once there (PredictConfig.tile_px)
        if self.config.tile_px != self.tile_px:
            object.__setattr__(self, "config", replace(self.config, tile_px=self.tile_px))


@dataclass(frozen=True, slots=True)
class Product:
    """A product's plan: the model, the grid, its tiles with work, and each tile's key."""

    setup: TiledSetup
    model: BackendModel
    meta: ModelMeta
    device: torch.device
    plan: GridPlan
    layout: WindowLayout
    tiles: tuple[MapTile, ...]  # the tiles with work, in lattice order
    costs: tuple[int, ...]
    keys: dict[str, str]
    reads: dict[str, list[str]]  # the images each tile reads


def plan_product(setup: TiledSetup, *, quiet: bool) -> Product:
    config = setup.config
    urls = [config.model, *config.images, config.out]
    check_storage_options(urls, config.storage_options)
    if is_local(config.out):
        check_can_create_in(local_path(config.out), option="--out")
    tta_ops(config.tta)
    device = torch_device(config.device, error=PredictionError)
    FreedMemory().reuse()
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
        config.images, storage_options=config.storage_options, zero_is_nodata=config.zero_is_nodata
    )
    check_sources_fit(sources, meta, config.model)
    plan = plan_output_grid(
        sources,
        config.region,
        resolution_m=meta.resolution_m,
        crs=None if config.dst_crs is None else parse_crs(config.dst_crs, what="--dst-crs"),
        resolution=config.resolution,
        max_pixels=None,  # --max-pixels guards one COG; PredictConfig checks each tile
        quiet=quiet,
    )
    grid = plan.grid
    layout = WindowLayout.over(grid.height, grid.width, size=meta.chip_size, overlap=overlap)
    if plan.region is not None and not region_has_pixels(plan, config.block_px):
        raise RegionError(
            f"region covers no pixel centre of the images at {grid.resolution:g} "
            "units/px after masking; give a larger region or a finer --resolution"
        )
    # `auto` decided from the whole grid, alike on every rank and task; keys record what runs
    model = for_prediction(model, layout.num_windows * layout.size**2)
    setup = replace(setup, config=with_inference(config, model))
    config = setup.config
    lattice = map_tiles(grid, setup.tile_px)
    costs = tile_costs(plan, lattice)
    tiles = tuple(t for t, c in zip(lattice, costs, strict=True) if c > 0)
    kept_costs = tuple(c for c in costs if c > 0)
    # The settings a distributed one-COG run keys its parts by (one owner of that list).
    settings = RankRun(
        config, plan, layout, meta.num_classes, device.type, OutputPaths(config.out), 0, 1
    ).settings()
    model_print = fingerprint(config.model, config.storage_options)
    reads = {t.name: sources_read(plan, layout, t) for t in tiles}
    paths = list(dict.fromkeys(p for ps in reads.values() for p in ps))
    prints = dict(zip(paths, fingerprints(paths, config.storage_options), strict=True))
    keys = {
        t.name: tile_key(
            settings,
            setup.tile_px,
            t.window,
            model_print,
            [(p, prints[p]) for p in reads[t.name]],
        )
        for t in tiles
    }
    logger.info(
        "tiled product of %d x %d px in %d tile(s) of %d px from %d image(s)",
        grid.width,
        grid.height,
        len(tiles),
        setup.tile_px,
        len(plan.sources),
    )
    return Product(setup, model, meta, device, plan, layout, tiles, kept_costs, keys, reads)


def sources_read(plan: GridPlan, layout: WindowLayout, tile: MapTile) -> list[str]:
    """Paths of the images a tile reads (the tile and the windows reaching past it)."""
    return plan.sources_read(tile.window, layout.size)
