"""Predict a tiled map product: one COG per tile of a fixed lattice (`landcover.prediction.
maptiles`), a STAC Collection with one item per tile and a VRT mosaic of them
(`landcover.prediction.tilecatalog`), in a directory on disk or on az://.

Tiles are the unit of work. `predict_tiles(setup, names)` predicts the given tiles, each as a
window of the output grid, with the setup and the window-into-file loop of a one-COG
prediction (`landcover.prediction.prepared`, `landcover.prediction.intofile`), and a pixel
comes out the same whichever block, tile or rank computes it (`landcover.prediction.windows`),
so the mosaic of the tiles equals the one COG of the same region pixel for pixel. A tile is
committed by its record (`landcover.prediction.tilerecords`) after its COG; a tile whose
record has this run's key and whose COG has the recorded size is kept, so a rerun redoes only
the tiles missing or half-made (`landcover.prediction.tilestate`). The directory belongs to
one product (`landcover.prediction.tileowner`): another
product's files, or a user's, are replaced only with --overwrite, which leaves nothing of the
old product; a tile COG carries its product's key in its tags, so one put in place by a run
that died before its record is predicted again without --overwrite.

`predict_product` is the stage: every rank of a job takes its tiles (balanced by area,
`maptiles.assign_tiles`) and writes them itself; rank 0 then waits for every tile's record and
writes the collection and the mosaic, which only list the tiles (no rank reads the pixels of
the whole).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from pystac.extensions.file import FileExtension

from landcover.errors import PredictionError
from landcover.outputlock import exclusive_outputs
from landcover.prediction.blocks import require_predicted_pixels
from landcover.prediction.intofile import predict_into_file
from landcover.prediction.maptiles import MapTile, assign_tiles
from landcover.prediction.outfiles import to_cog
from landcover.prediction.setup import GDAL_CACHE_BYTES, warnings_to_log
from landcover.prediction.stacitem import ASSET_KEY, cog_item, items_read
from landcover.prediction.tilecatalog import MOSAIC, write_catalog
from landcover.prediction.tileowner import claim
from landcover.prediction.tileplan import Product, TiledSetup, plan_product
from landcover.prediction.tilerecords import TAG_PRODUCT, ProductDir, TileRecord
from landcover.prediction.tilestate import (
    check_owner,
    committed_count,
    tiles_to_predict,
    wait_for_tiles,
)
from landcover.writefailures import raster_write_errors
from tiling.tiler.units import UnitRunner

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TiledResult:
    """What `predict_product` did; on ranks other than 0, about the rank's own tiles."""

    out: str
    grid_width: int
    grid_height: int
    resolution: float
    crs: str
    tiles: int  # tiles of the product (those with data)
    predicted: int  # tiles this process predicted
    # tiles committed before this run began: of the whole product on rank 0 (looked up at its
    # start, the other ranks' tiles included), of its own tiles on the other ranks
    kept: int
    valid_pixels: int
    sources: tuple[str, ...]
    elapsed_s: float


def predict_product(
    setup: TiledSetup,
    *,
    rank: int = 0,
    world_size: int = 1,
    run_units: UnitRunner | None = None,
) -> TiledResult:
    """Predict the tiled product of `setup` as rank `rank` of `world_size`: this rank's tiles,
    and on rank 0 the collection and the mosaic once every tile is committed.

    With `run_units` (a task scheduler's runner, `tiling.tiler.units.UnitRunner`; one rank only),
    every tile left to predict is a task of its own, started largest first, and this process
    writes the collection and the mosaic when the tasks are done."""
    started = time.perf_counter()
    config = setup.config
    if not 0 <= rank < world_size:
        raise PredictionError(
            f"rank {rank} of world size {world_size}: need 0 <= rank < world size"
        )
    if run_units is not None and world_size != 1:
        raise PredictionError(f"tiles as tasks run from one process, not {world_size} ranks")
    lock = exclusive_outputs((config.out,), "predict", inside=True) if rank == 0 else nullcontext()
    with warnings_to_log(), lock:
        product = plan_product(setup, quiet=rank != 0)
        product_dir = ProductDir(config.out, config.storage_options)
        key = check_owner(product, product_dir)
        if rank == 0:  # before any tile of this rank; the other ranks' are recognised
            claim(product_dir, key, product.keys)
        owned = assign_tiles(product.costs, world_size)[rank]
        mine = [product.tiles[i] for i in owned]
        todo = tiles_to_predict(product, product_dir, mine)
        kept = len(mine) - len(todo)
        if rank == 0 and world_size > 1:
            own = {t.name for t in mine}
            others = [t for t in product.tiles if t.name not in own]
            kept += committed_count(product, product_dir, others)
        if run_units is None:
            predicted = _predict(product, product_dir, todo, key)
        else:
            cost = dict(zip((t.name for t in product.tiles), product.costs, strict=True))
            names = sorted((t.name for t in todo), key=lambda n: -cost[n])
            run_units(_predict_tile_task, names, shared=(setup, uuid.uuid4().hex), what="tile")
            predicted = len(names)
        if rank == 0:
            records = wait_for_tiles(product, product_dir)
            pixels = np.sum([np.asarray(r.class_pixels, np.int64) for r in records], axis=0)
            require_predicted_pixels(pixels)
            read = dict.fromkeys(p for t in product.tiles for p in product.reads[t.name])
            with raster_write_errors(f"{product_dir.url}{MOSAIC}"):
                prepared = product.prepared
                write_catalog(
                    product_dir, records, prepared.grid, prepared.meta, config.model, list(read)
                )
        else:
            records = [r for t in mine if (r := product_dir.read_record(t.name)) is not None]
    valid = int(sum(sum(r.class_pixels[1:]) for r in records))
    grid = product.prepared.grid
    return TiledResult(
        out=product_dir.url,
        grid_width=grid.width,
        grid_height=grid.height,
        resolution=grid.resolution,
        crs=grid.crs.to_string(),
        tiles=len(records),
        predicted=predicted,
        kept=kept,
        valid_pixels=valid,
        sources=tuple(s.path for s in product.prepared.plan.sources),
        elapsed_s=time.perf_counter() - started,
    )


def predict_tiles(setup: TiledSetup, names: Sequence[str]) -> list[TileRecord]:
    """Predict the tiles `names` of the product of `setup` into its directory and commit
    each; a tile already committed with this run's key is kept. Returns the tiles' records.

    The unit of work of a tiled product: an engine may call it from any process, once per
    tile or with any list, twice for a tile if it must. It plans the product itself (loads
    the model, plans the grid), refuses tile files from other runs without --overwrite as
    `predict_product` does, and writes no collection or mosaic."""
    with warnings_to_log():
        _predict_named(plan_product(setup, quiet=True), names)
    product_dir = ProductDir(setup.config.out, setup.config.storage_options)
    records = [product_dir.read_record(n) for n in names]
    return [r for r in records if r is not None]


# One planned product per process, for the tile tasks of one run (`_predict_tile_task`).
_PLANNED: dict[str, Product] = {}
_PLANNED_LOCK = threading.Lock()


def _predict_tile_task(setup: TiledSetup, run_id: str, name: str) -> None:
    """A task of `predict_product(run_units=...)`: predict tile `name`. The product is planned
    once per process and run (`run_id`), not once per tile: a worker that takes many tiles
    of a run loads the model and plans the grid once."""
    with warnings_to_log():
        with _PLANNED_LOCK:
            product = _PLANNED.get(run_id)
            if product is None:
                _PLANNED.clear()  # another run's plan: its inputs may have changed since
                product = _PLANNED[run_id] = plan_product(setup, quiet=True)
        _predict_named(product, [name])


def _predict_named(product: Product, names: Sequence[str]) -> None:
    """Predict and commit the tiles `names` of `product`, keeping those already committed."""
    product_dir = ProductDir(product.setup.config.out, product.setup.config.storage_options)
    by_name = {t.name: t for t in product.tiles}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise PredictionError(
            f"tile {unknown[0]} is not a tile with data of {product_dir.url}; "
            f"its tiles are {', '.join(list(by_name)[:3])}..."
        )
    tiles = [by_name[n] for n in dict.fromkeys(names)]
    key = check_owner(product, product_dir)
    _predict(product, product_dir, tiles_to_predict(product, product_dir, tiles), key)


def _predict(product: Product, product_dir: ProductDir, tiles: Sequence[MapTile], key: str) -> int:
    """Predict and commit `tiles`, each tagged with the product's `key`; how many. Nothing
    of a tile is kept once it is committed (its images are closed after it, too): memory
    does not grow with the tiles."""
    with (
        rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS"),
        product_dir.scratch() as scratch,
    ):
        for tile in tiles:
            # a full disk or ulimit -f under GDAL: one line naming the tile (not committed)
            with raster_write_errors(f"{product_dir.url}{tile.name}.tif"):
                _predict_tile(product, product_dir, tile, scratch, key)
    return len(tiles)


def _predict_tile(
    product: Product, product_dir: ProductDir, tile: MapTile, scratch: str, key: str
) -> TileRecord:
    """Predict one tile into a COG, put it in place and commit its record."""
    token = uuid.uuid4().hex[:8]
    tiled = str(Path(scratch) / f".{tile.name}.{token}.tiles.part.tif")
    cog = str(Path(scratch) / f".{tile.name}.{token}.cog.part.tif")
    try:
        counts = predict_into_file(
            product.prepared,
            tile.window,
            tiled,
            sources=product.reads[tile.name],
            band_tags={TAG_PRODUCT: key},  # known as the product's, record or not
        )
        # No pixel with data (the tile's images are nodata there): no COG and no item, the
        # mosaic reads nodata as the one COG has; the record alone commits the tile.
        has_data = bool(counts.class_pixels[1:].any())
        size, item = _put_cog(product, product_dir, tile, tiled, cog) if has_data else (0, {})
        record = TileRecord(
            name=tile.name,
            key=product.keys[tile.name],
            rect=tile.window,
            windows=counts.windows,
            class_pixels=tuple(int(v) for v in counts.class_pixels),
            file_bytes=size,
            item=item,
        )
        product_dir.commit(record)
    finally:
        for path in (tiled, cog):
            Path(path).unlink(missing_ok=True)
            Path(path + ".aux.xml").unlink(missing_ok=True)
    if has_data:
        logger.info("wrote tile %s (%d windows) to %s", tile.name, record.windows, product_dir.url)
    else:
        logger.info("tile %s has no pixel with data: no COG written", tile.name)
    return record


def _put_cog(
    product: Product, product_dir: ProductDir, tile: MapTile, tiled: str, cog: str
) -> tuple[int, dict[str, Any]]:
    """Turn the tile's tiled GeoTIFF into its COG `cog` and put it in place (replacing a
    file checked before); the COG's size and its STAC item (as JSON)."""
    to_cog(tiled, cog, resampling="MODE")
    item = cog_item(cog, sources=items_read(product.setup.stac_sources, product.reads[tile.name]))
    item.id = tile.name
    item.assets[ASSET_KEY].href = f"./{tile.name}.tif"
    size = Path(cog).stat().st_size
    files = FileExtension.ext(item.assets[ASSET_KEY], add_if_missing=True)
    files.size = size
    files.checksum = "1220" + _sha256(cog)  # multihash: sha2-256, 32 bytes
    product_dir.put_file(cog, f"{tile.name}.tif")
    return size, item.to_dict(include_self_link=False, transform_hrefs=False)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
