"""Predict a tiled map product: one COG per tile of a fixed lattice (`landcover.prediction.
maptiles`), a STAC Collection with one item per tile and a VRT mosaic of them
(`landcover.prediction.tilecatalog`), in a directory on disk or on az://.

Tiles are the unit of work. `predict_tiles(setup, names)` predicts the given tiles, each as a
window of the output grid: its blocks are read, run and blended by the very machinery of a
one-COG prediction (`landcover.prediction.blockstages`), and a pixel comes out the same
whichever block, tile or rank computes it (`landcover.prediction.windows`), so the mosaic of
the tiles equals the one COG of the same region pixel for pixel. A tile is committed by its
record (`landcover.prediction.tilerecords`) after its COG; a tile whose record has this run's
key and whose COG has the recorded size is kept, so a rerun redoes only the tiles missing or
half-made. The directory belongs to one product (`landcover.prediction.tileowner`): another
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
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.errors
from pystac.extensions.file import FileExtension

from landcover.errors import OutputExistsError, PredictionError
from landcover.outputlock import exclusive_outputs
from landcover.prediction.assemble import PART_POLL  # tile records: as parts
from landcover.prediction.blocks import block_schedule, require_predicted_pixels
from landcover.prediction.blockstages import (
    BlockPredictor,
    BlockWriter,
    PredictedBlock,
    PreparedBlock,
    prepare_block,
)
from landcover.prediction.maptiles import MapTile, assign_tiles
from landcover.prediction.outfiles import (
    class_profile,
    describe_class_raster,
    to_cog,
)
from landcover.prediction.pipeline import run_pipeline
from landcover.prediction.setup import (
    GDAL_CACHE_BYTES,
    FreedMemory,
    block_cache_bytes,
    warnings_to_log,
)
from landcover.prediction.stacitem import ASSET_KEY, cog_item, items_read
from landcover.prediction.tilecatalog import MOSAIC, write_catalog
from landcover.prediction.tileowner import check_ownership, claim, product_key
from landcover.prediction.tileplan import (
    Product,
    TiledSetup,
    plan_product,
)
from landcover.prediction.tilerecords import RECORDS_DIR, TAG_PRODUCT, ProductDir, TileRecord
from landcover.prediction.tta import tta_ops
from landcover.prediction.windows import WindowRunner
from landcover.writefailures import raster_write_errors
from tiling.reader import RasterReader
from tiling.staged import wait_for_records
from tiling.units import UnitRunner

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

    With `run_units` (a task scheduler's runner, `tiling.units.UnitRunner`; one rank only),
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
        key = _check_owner(product, product_dir)
        if rank == 0:  # before any tile of this rank; the other ranks' are recognised
            claim(product_dir, key, product.keys)
        owned = assign_tiles(product.costs, world_size)[rank]
        mine = [product.tiles[i] for i in owned]
        todo = _tiles_to_predict(product, product_dir, mine)
        kept = len(mine) - len(todo)
        if rank == 0 and world_size > 1:
            own = {t.name for t in mine}
            others = [t for t in product.tiles if t.name not in own]
            kept += _committed_count(product, product_dir, others)
        if run_units is None:
            predicted = _predict(product, product_dir, todo, key)
        else:
            cost = dict(zip((t.name for t in product.tiles), product.costs, strict=True))
            names = sorted((t.name for t in todo), key=lambda n: -cost[n])
            run_units(_predict_tile_task, names, shared=(setup, uuid.uuid4().hex), what="tile")
            predicted = len(names)
        if rank == 0:
            records = _wait_for_tiles(product, product_dir)
            pixels = np.sum([np.asarray(r.class_pixels, np.int64) for r in records], axis=0)
            require_predicted_pixels(pixels)
            read = dict.fromkeys(p for t in product.tiles for p in product.reads[t.name])
            with raster_write_errors(f"{product_dir.url}{MOSAIC}"):
                write_catalog(
                    product_dir, records, product.plan.grid, product.meta, config.model, list(read)
                )
        else:
            records = [r for t in mine if (r := product_dir.read_record(t.name)) is not None]
    valid = int(sum(sum(r.class_pixels[1:]) for r in records))
    grid = product.plan.grid
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
        sources=tuple(s.path for s in product.plan.sources),
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
    key = _check_owner(product, product_dir)
    _predict(product, product_dir, _tiles_to_predict(product, product_dir, tiles), key)


def _check_owner(product: Product, product_dir: ProductDir) -> str:
    """The product's key; refuses a directory that holds another product's files, or a
    user's, unless --overwrite (`landcover.prediction.tileowner`)."""
    key = product_key(product.keys)
    check_ownership(
        product_dir,
        key,
        product.keys,
        overwrite=product.setup.config.overwrite,
        tile_owner=partial(_tile_product, product_dir),
    )
    return key


def _tile_product(product_dir: ProductDir, name: str) -> str | None:
    """The product key in the tags of the tile file `name`; None when it has none (a file
    that is not a landcover tile, or not a raster)."""
    with ExitStack() as stack:
        if product_dir.local:
            path = product_dir.path(name)
        else:  # a rare case (a tile without its record): one download
            into = stack.enter_context(tempfile.TemporaryDirectory(prefix="landcover-tile-"))
            path = product_dir.fetch(name, into)
        try:
            with warnings_to_log(), rasterio.open(path) as ds:
                key = ds.tags(1).get(TAG_PRODUCT)
        except (rasterio.errors.RasterioIOError, IndexError):
            return None
    return None if key is None else str(key)


def _tiles_to_predict(
    product: Product, product_dir: ProductDir, tiles: Sequence[MapTile]
) -> list[MapTile]:
    """Those of `tiles` without a committed COG of this run's key; raises
    `OutputExistsError` for a file at a tile's name that is not a landcover tile (no product
    key in its tags: a user's), unless --overwrite. A landcover tile without its committed
    record (a run died between the two, or it belongs to the product this one replaces) is
    predicted again. Only the caller's own tiles: another rank may be writing the others."""
    present = product_dir.names()
    todo: list[MapTile] = []
    foreign: list[str] = []
    for tile in tiles:
        record = product_dir.read_record(tile.name)
        if product_dir.committed(record, product.keys[tile.name]):
            continue
        todo.append(tile)
        name = f"{tile.name}.tif"
        overwrite = product.setup.config.overwrite
        if name in present and not overwrite and _tile_product(product_dir, name) is None:
            foreign.append(name)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputExistsError(
            f"{product_dir.url}{foreign[0]}{more} is not a tile of this product (it holds no "
            "landcover product key: a file of your own?); move it away, pass --overwrite to "
            "replace it, or choose another --out"
        )
    kept = len(tiles) - len(todo)
    if kept:
        logger.info("keeping %d finished tile(s) in %s", kept, product_dir.url)
    return todo


def _predict(product: Product, product_dir: ProductDir, tiles: Sequence[MapTile], key: str) -> int:
    """Predict and commit `tiles`, each tagged with the product's `key`; how many. Nothing
    of a tile is kept once it is committed: memory does not grow with the tiles."""
    with ExitStack() as stack:
        stack.enter_context(
            rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_BYTES, GDAL_NUM_THREADS="ALL_CPUS")
        )
        scratch = stack.enter_context(product_dir.scratch())
        for tile in tiles:
            # A reader per tile, closed after it: a tile's pipeline reads in a thread of its
            # own, and a thread's image handles (each with GDAL's buffers of a decoded block,
            # a megabyte or more) end only with the reader's close().
            reader = RasterReader(storage_options=product.setup.config.storage_options)
            try:
                # a full disk or ulimit -f under GDAL: one line naming the tile (not committed)
                with raster_write_errors(f"{product_dir.url}{tile.name}.tif"):
                    _predict_tile(product, product_dir, reader, tile, scratch, key)
            finally:
                reader.close()
    return len(tiles)


def _predict_tile(
    product: Product,
    product_dir: ProductDir,
    reader: RasterReader,
    tile: MapTile,
    scratch: str,
    key: str,
) -> TileRecord:
    """Predict one tile into a COG, put it in place and commit its record."""
    token = uuid.uuid4().hex[:8]
    tiled = str(Path(scratch) / f".{tile.name}.{token}.tiles.part.tif")
    cog = str(Path(scratch) / f".{tile.name}.{token}.cog.part.tif")
    try:
        windows, class_pixels = _predict_into(product, reader, tile, tiled, key)
        if not class_pixels[1:].any():
            # No pixel with data (the tile's images are nodata there): no COG and no item,
            # the mosaic reads nodata as the one COG has; the record alone commits the tile.
            record = TileRecord(
                name=tile.name,
                key=product.keys[tile.name],
                rect=tile.window,
                windows=windows,
                class_pixels=tuple(int(v) for v in class_pixels),
                file_bytes=0,
                item={},
            )
            product_dir.commit(record)
            logger.info("tile %s has no pixel with data: no COG written", tile.name)
            return record
        to_cog(tiled, cog, resampling="MODE")
        item = cog_item(
            cog, sources=items_read(product.setup.stac_sources, product.reads[tile.name])
        )
        item.id = tile.name
        item.assets[ASSET_KEY].href = f"./{tile.name}.tif"
        size = Path(cog).stat().st_size
        files = FileExtension.ext(item.assets[ASSET_KEY], add_if_missing=True)
        files.size = size
        files.checksum = "1220" + _sha256(cog)  # multihash: sha2-256, 32 bytes
        product_dir.put_file(cog, f"{tile.name}.tif")  # replaces a file checked before
        record = TileRecord(
            name=tile.name,
            key=product.keys[tile.name],
            rect=tile.window,
            windows=windows,
            class_pixels=tuple(int(v) for v in class_pixels),
            file_bytes=size,
            item=item.to_dict(include_self_link=False, transform_hrefs=False),
        )
        product_dir.commit(record)
    finally:
        for path in (tiled, cog):
            Path(path).unlink(missing_ok=True)
            Path(path + ".aux.xml").unlink(missing_ok=True)
    logger.info("wrote tile %s (%d windows) to %s", tile.name, windows, product_dir.url)
    return record


def _predict_into(
    product: Product, reader: RasterReader, tile: MapTile, tiled: str, key: str
) -> tuple[int, npt.NDArray[np.int64]]:
    """Predict `tile`'s blocks into the tiled GeoTIFF `tiled` of the tile's grid, as a
    one-COG run predicts its blocks (reading, inference and writing overlap)."""
    config, meta, plan = product.setup.config, product.meta, product.plan
    windows = WindowRunner(
        product.model,
        meta,
        product.layout,
        batch_size=config.batch_size,
        where=config.model,
        device=product.device,
        tta_ops=tta_ops(config.tta),
    )
    target = tile.grid(plan.grid)
    cache = block_cache_bytes(config.block_px, target.width, 1, in_bands=meta.in_channels)
    with (
        rasterio.Env(GDAL_CACHEMAX=cache),
        rasterio.open(tiled, "w", **class_profile(target)) as dst,
    ):
        describe_class_raster(dst, meta, sources=product.reads[tile.name])
        dst.update_tags(**product.model.inference.tags())  # what ran: backend, precision
        dst.update_tags(1, **{TAG_PRODUCT: key})  # known as the product's, record or not
        predictor = BlockPredictor(
            windows, meta.num_classes, device=product.device, probabilities=False
        )
        writer = BlockWriter(dst, None, meta.num_classes, target=tile.window)
        memory = FreedMemory()

        def predict(prepared: PreparedBlock) -> PredictedBlock:
            predicted = predictor(prepared)  # a block row starts at the tile's left edge
            if prepared.todo:
                memory.release()
            return predicted

        run_pipeline(
            block_schedule(product.layout, tile.window, config.block_px),
            partial(prepare_block, plan, product.layout, reader),
            predict,
            writer,
            threaded=config.pipeline,
        )
    return windows.windows_run, writer.class_pixels


def _committed_count(product: Product, product_dir: ProductDir, tiles: Iterable[MapTile]) -> int:
    """How many of `tiles` are committed with this run's keys now (one listing, then the
    records of those listed)."""
    listed = product_dir.names(RECORDS_DIR)
    return sum(
        1
        for t in tiles
        if f"{t.name}.json" in listed
        and product_dir.committed(product_dir.read_record(t.name), product.keys[t.name])
    )


def _wait_for_tiles(product: Product, product_dir: ProductDir) -> list[TileRecord]:
    """Rank 0: the committed record of every tile, in tile order, once all are there."""

    def read(name: str) -> TileRecord | None:
        record = product_dir.read_record(name)
        return record if product_dir.committed(record, product.keys[name]) else None

    def waiting(seconds: float, pending: list[str]) -> None:
        logger.info("waiting %.0f s for %d tile(s) in %s", seconds, len(pending), product_dir.url)

    found = wait_for_records(
        product_dir,
        {t.name: f"{t.name}.json" for t in product.tiles},
        read,
        schedule=PART_POLL,
        under=RECORDS_DIR,
        waiting=waiting,
    )
    return [found[t.name] for t in product.tiles]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
