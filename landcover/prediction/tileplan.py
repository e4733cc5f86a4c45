"""The plan of a tiled map product (`landcover.prediction.tiled`): the prepared prediction
(model, output grid, windows: `landcover.prediction.prepared`, as a one-COG run's), the
lattice tiles with work in it, what each costs, which images each reads, and each tile's key.
The tile size is `PredictConfig.tile_px`, checked where the config is built."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from landcover.outputs import check_can_create_in
from landcover.prediction.blend import WindowLayout
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import pixel_settings
from landcover.prediction.maptiles import MapTile, map_tiles, tile_costs
from landcover.prediction.outgrid import GridPlan
from landcover.prediction.prepared import PreparedPrediction, prediction_device, prepare_prediction
from landcover.prediction.tilerecords import tile_key
from tiling.runtime.fingerprint import fingerprint, fingerprints
from tiling.runtime.urls import check_storage_options, is_local, local_path
from tiling.sources.stacquery import StacSource

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
    """A product's plan: the prepared prediction (model, grid, windows), its tiles with work,
    and each tile's key. `setup.config` is `prepared.config` (what runs, `auto` resolved)."""

    setup: TiledSetup
    prepared: PreparedPrediction
    tiles: tuple[MapTile, ...]  # the tiles with work, in lattice order
    costs: tuple[int, ...]
    keys: dict[str, str]
    reads: dict[str, list[str]]  # the images each tile reads


def plan_product(setup: TiledSetup, *, quiet: bool) -> Product:
    """Check that the tiled `--out` can be made, set the prediction up
    (`landcover.prediction.prepared`) and plan its tiles: those of the lattice with work, what
    each costs, the images each reads and each one's key. Every rank and task plans alike."""
    config = setup.config
    urls = [config.model, *config.images, config.out, *filter(None, [config.calibration])]
    check_storage_options(urls, config.storage_options)
    if is_local(config.out):
        check_can_create_in(local_path(config.out), option="--out")
    # --max-pixels guards one COG; here each tile (PredictConfig checks tile_px)
    prepared = prepare_prediction(config, prediction_device(config), max_pixels=None, quiet=quiet)
    setup = replace(setup, config=prepared.config)  # keys record what runs, not `auto`
    plan, layout = prepared.plan, prepared.layout
    lattice = map_tiles(plan.grid, setup.tile_px)
    costs = tile_costs(plan, lattice)
    tiles = tuple(t for t, c in zip(lattice, costs, strict=True) if c > 0)
    kept_costs = tuple(c for c in costs if c > 0)
    settings = pixel_settings(prepared)
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
        plan.grid.width,
        plan.grid.height,
        len(tiles),
        setup.tile_px,
        len(plan.sources),
    )
    return Product(setup, prepared, tiles, kept_costs, keys, reads)


def sources_read(plan: GridPlan, layout: WindowLayout, tile: MapTile) -> list[str]:
    """Paths of the images a tile reads (the tile and the windows reaching past it)."""
    return plan.sources_read(tile.window, layout.size)
