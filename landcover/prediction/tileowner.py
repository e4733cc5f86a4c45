"""Who owns a tiled product's directory: one product key, and nothing else in it without
--overwrite.

A product's key is the hash of its tiles' keys (`tilerecords.tile_key`: model, images,
region, grid, options and tile size), so two runs make the same product exactly when they
would write the same tiles. The directory is claimed by writing `records/product.json` with
that key before any tile is written (rank 0, or the process that hands tiles out as tasks);
every tile COG carries the key too, as the band tag `LANDCOVER_PRODUCT`, so a tile renamed
into place by a run that died before its record is still known as the product's own: it is
predicted again, without --overwrite.

In a directory the product does not own (no claim, or another product's), every entry but
hidden ones (the lock, scratch directories) must be the product's own work (a tile with the
key in its tags, a record with its tile's key, put there by another rank of this run) or the
run is refused in one line; a user's `collection.json`, `mosaic.vrt`, `quicklook.png`, a file
named like an item or a tile, or another product's index are never replaced without
--overwrite. With --overwrite the old product goes: its tiles, items and records outside the
new lattice, and its collection, mosaic and quicklook, before the new product is claimed;
files at names no product uses are left alone. Only the claiming process removes anything,
and never a name of the new product, so it cannot race with a rank writing a tile.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from landcover.errors import OutputExistsError
from landcover.outputs import output_errors
from landcover.prediction.tilecatalog import COLLECTION, MOSAIC, QUICKLOOK
from landcover.prediction.tilerecords import RECORDS_DIR, ProductDir, TileRecord
from tiling.staged.keys import content_key
from tiling.staged.record import check_format, publish_record, read_record, record_header

logger = logging.getLogger(__name__)

PRODUCT_FORMAT = "landcover-map-product"
PRODUCT_VERSION = 1
_CLAIM_NAME = "product.json"
PRODUCT_RECORD = f"{RECORDS_DIR}/{_CLAIM_NAME}"
# The name of a tile (`maptiles.map_tiles`), and of its item (.json) and record.
_TILE_NAME = re.compile(r"E-?\d+(?:p\d+)?_N-?\d+(?:p\d+)?")
_INDEX_NAMES = (COLLECTION, MOSAIC, QUICKLOOK)

TileOwner = Callable[[str], str | None]
"""The product key in the tags of the tile file `name` of the directory; None when it holds
none (not a landcover tile)."""


@dataclass(frozen=True, slots=True)
class ProductClaim:
    """`records/product.json`: the key of the product that owns the directory."""

    key: str
    tiles: int

    def to_json(self) -> dict[str, Any]:
        return record_header(PRODUCT_FORMAT, PRODUCT_VERSION) | {
            "key": self.key,
            "tiles": self.tiles,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ProductClaim:
        check_format(obj, PRODUCT_FORMAT, PRODUCT_VERSION)
        return cls(key=str(obj["key"]), tiles=int(obj["tiles"]))


def product_key(tile_keys: Mapping[str, str]) -> str:
    """The key of the product whose tiles (name → tile key) are `tile_keys`."""
    return content_key(
        record_header(PRODUCT_FORMAT, PRODUCT_VERSION) | {"tiles": sorted(tile_keys.items())}
    )


def owner(product_dir: ProductDir) -> str | None:
    """The key of the product that claimed the directory, None when none did."""
    claim = read_record(product_dir, PRODUCT_RECORD, ProductClaim.from_json)
    return None if claim is None else claim.key


def check_ownership(
    product_dir: ProductDir,
    key: str,
    tile_keys: Mapping[str, str],
    *,
    overwrite: bool,
    tile_owner: TileOwner,
) -> bool:
    """Whether the directory is this product's (claimed with `key`); raises
    `OutputExistsError` when it holds anything else and `overwrite` is not set (see the
    module docstring). `tile_owner(name)` reads a tile file's product key from its tags."""
    claimed = owner(product_dir)
    if claimed == key:
        return True
    if overwrite:
        return False
    if claimed is not None:
        raise OutputExistsError(
            f"{product_dir.url} holds another tiled product (other model, images, region, "
            "options or tile size); pass --overwrite to replace it, or choose another --out"
        )
    stray = _first_stray(product_dir, key, tile_keys, tile_owner)
    if stray is not None:
        raise OutputExistsError(
            f"{product_dir.url}{stray} is not part of this tiled product (not written by "
            "landcover for these inputs and options); move it away, pass --overwrite to "
            "replace the product's files there, or choose another --out"
        )
    return False


def claim(product_dir: ProductDir, key: str, tile_keys: Mapping[str, str]) -> None:
    """Make the directory this product's: remove what is left of another product (every
    tile, item and record at a name outside `tile_keys`, and the collection, mosaic and
    quicklook), then publish the claim. Call after `check_ownership` refused nothing."""
    if owner(product_dir) == key:
        return
    removed = []
    with output_errors():
        for name in sorted(product_dir.names()):
            stem, _, suffix = name.rpartition(".")
            if name in _INDEX_NAMES or (
                _TILE_NAME.fullmatch(stem) and suffix in ("tif", "json") and stem not in tile_keys
            ):
                product_dir.delete(name)
                removed.append(name)
        for name in sorted(product_dir.names(RECORDS_DIR)):
            stem, _, suffix = name.rpartition(".")
            if suffix == "json" and stem not in tile_keys:
                product_dir.delete(f"{RECORDS_DIR}/{name}")
                removed.append(f"{RECORDS_DIR}/{name}")
        publish_record(product_dir, PRODUCT_RECORD, ProductClaim(key, len(tile_keys)).to_json())
    if removed:
        logger.info("removed %d file(s) of the old product in %s", len(removed), product_dir.url)


def _first_stray(
    product_dir: ProductDir, key: str, tile_keys: Mapping[str, str], tile_owner: TileOwner
) -> str | None:
    """The first entry of an unclaimed directory that is not this product's own work."""
    for name in sorted(product_dir.names()):
        if name.startswith("."):  # the lock, scratch directories, a user's dot files
            continue
        if name == RECORDS_DIR:
            for entry in sorted(product_dir.names(RECORDS_DIR)):
                stem = entry.removesuffix(".json")
                if entry.startswith(".") or entry == _CLAIM_NAME:
                    continue
                record = read_record(product_dir, f"{RECORDS_DIR}/{entry}", TileRecord.from_json)
                if stem not in tile_keys or record is None or record.key != tile_keys[stem]:
                    return f"{RECORDS_DIR}/{entry}"
            continue
        stem = name.removesuffix(".tif")
        if name.endswith(".tif") and stem in tile_keys and tile_owner(name) == key:
            continue  # written by another rank of this run
        return name
    return None
