"""Where a tiled product's tiles stand in its directory (`landcover.prediction.tiled`):
whose the directory is, which tiles are committed with this run's keys, which are left to
predict, and rank 0's wait for every tile's record.

A tile is committed by its record (`landcover.prediction.tilerecords`) after its COG; a
tile COG carries its product's key in its tags, so a file at a tile's name without that key
is a user's and is replaced only with --overwrite (`landcover.prediction.tileowner`).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from functools import partial

import rasterio
import rasterio.errors

from landcover.errors import OutputExistsError
from landcover.prediction.assemble import PART_POLL  # tile records: as parts
from landcover.prediction.maptiles import MapTile
from landcover.prediction.setup import warnings_to_log
from landcover.prediction.tileowner import check_ownership, product_key
from landcover.prediction.tileplan import Product
from landcover.prediction.tilerecords import RECORDS_DIR, TAG_PRODUCT, ProductDir, TileRecord
from tiling.staged import wait_for_records

__all__ = [
    "check_owner",
    "committed_count",
    "tile_product",
    "tiles_to_predict",
    "wait_for_tiles",
]

logger = logging.getLogger(__name__)


def check_owner(product: Product, product_dir: ProductDir) -> str:
    """The product's key; refuses a directory that holds another product's files, or a
    user's, unless --overwrite (`landcover.prediction.tileowner`)."""
    key = product_key(product.keys)
    check_ownership(
        product_dir,
        key,
        product.keys,
        overwrite=product.setup.config.overwrite,
        tile_owner=partial(tile_product, product_dir),
    )
    return key


def tile_product(product_dir: ProductDir, name: str) -> str | None:
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


def tiles_to_predict(
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
        if name in present and not overwrite and tile_product(product_dir, name) is None:
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


def committed_count(product: Product, product_dir: ProductDir, tiles: Iterable[MapTile]) -> int:
    """How many of `tiles` are committed with this run's keys now (one listing, then the
    records of those listed)."""
    listed = product_dir.names(RECORDS_DIR)
    return sum(
        1
        for t in tiles
        if f"{t.name}.json" in listed
        and product_dir.committed(product_dir.read_record(t.name), product.keys[t.name])
    )


def wait_for_tiles(product: Product, product_dir: ProductDir) -> list[TileRecord]:
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
