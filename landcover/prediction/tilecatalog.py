"""The index files of a tiled map product, written once every tile is committed:

- `<name>.json` per tile: its STAC item (built when the tile was written,
  `landcover.prediction.stacitem.cog_item`, with the file extension's size and checksum);
- `collection.json`: a STAC Collection linking every item (relative hrefs, self-contained),
  with the extent of the tiles, the class table under `item_assets` and the model with its
  validation metrics under `landcover:model`;
- `mosaic.vrt`: a GDAL VRT of the whole output grid over every tile (relative paths), with
  the tiles' colour table, nodata and class tags: GDAL's own copy of one tile, widened.

They list the tiles and read none of their pixels, so writing them costs the same for a
state as for a county.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pystac
from pystac.extensions.classification import ClassificationExtension
from pystac.extensions.file import FileExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import RasterExtension
from pystac.layout import CustomLayoutStrategy

from landcover.prediction.outgrid import TAG_SOURCES, OutputGrid
from landcover.prediction.stacitem import ASSET_KEY, COG_MEDIA_TYPE
from landcover.prediction.tilerecords import TAG_PRODUCT, ProductDir, TileRecord
from landcover.prediction.tilevrt import VrtTile, write_tile_vrt
from tiling.runtime.urls import is_local

if TYPE_CHECKING:  # modelfile imports torch, which writing files never needs
    from landcover.models.modelfile import ModelMeta

COLLECTION = "collection.json"
MOSAIC = "mosaic.vrt"
QUICKLOOK = "quicklook.png"  # written by `landcover predict` (landcover.view.quicklook)
# Metrics of the model's training run copied into the collection (ModelMeta.training).
MODEL_METRICS = ("val_miou", "val_accuracy", "per_class_iou", "epoch")


def write_catalog(
    product_dir: ProductDir,
    records: Sequence[TileRecord],
    grid: OutputGrid,
    meta: ModelMeta,
    model: str,
    sources: Sequence[str],
) -> None:
    """Write every tile's item, `mosaic.vrt` and, last, `collection.json` into the product;
    `sources`: the images the tiles were predicted from (the mosaic's sources tag).

    They are made in the product's scratch directory, on the product's own file system, and
    renamed into place (uploaded, on blob storage): never staged in the system's temporary
    directory, which may be another file system."""
    records = [r for r in records if r.has_data]  # a tile without data has no COG, no item
    with product_dir.scratch() as scratch:
        collection = product_collection(product_dir, records, meta, model)
        collection.normalize_hrefs(scratch, strategy=_ITEMS_BESIDE_TILES)
        collection.save(pystac.CatalogType.SELF_CONTAINED)
        for record in records:
            product_dir.put_file(str(Path(scratch) / f"{record.name}.json"), f"{record.name}.json")
        vrt = mosaic_vrt(product_dir, records, grid, scratch, sources)
        product_dir.put_file(vrt, MOSAIC)
        product_dir.put_file(str(Path(scratch) / COLLECTION), COLLECTION)


def product_collection(
    product_dir: ProductDir, records: Sequence[TileRecord], meta: ModelMeta, model: str
) -> pystac.Collection:
    """The product's STAC Collection with one item per tile (hrefs not yet normalised)."""
    items = [pystac.Item.from_dict(dict(r.item)) for r in records]
    bboxes = [item.bbox for item in items if item.bbox is not None]
    spatial = [
        min(b[0] for b in bboxes),
        min(b[1] for b in bboxes),
        max(b[2] for b in bboxes),
        max(b[3] for b in bboxes),
    ]
    times = [t for item in items for t in _times(item)]
    name = product_name(product_dir)
    collection = pystac.Collection(
        id=name,
        title=f"land cover {name}",
        description=(
            f"Land cover predicted by a {meta.architecture} model ({Path(model).name}) in "
            f"{len(items)} COG tiles, class table {meta.class_map.name}."
        ),
        extent=pystac.Extent(
            pystac.SpatialExtent([spatial]),
            pystac.TemporalExtent([[min(times, default=None), max(times, default=None)]]),
        ),
        license="other",
    )
    for extension in (ProjectionExtension, RasterExtension, ClassificationExtension, FileExtension):
        extension.add_to(collection)
    first = items[0].assets[ASSET_KEY].to_dict() if items else {}
    collection.extra_fields["item_assets"] = {
        ASSET_KEY: {
            "type": COG_MEDIA_TYPE,
            "roles": ["data"],
            "title": "land cover classes",
            **{k: v for k, v in first.items() if k in ("raster:bands", "classification:classes")},
        }
    }
    collection.extra_fields["landcover:model"] = _model_fields(meta, model)
    for item in items:
        collection.add_item(item)
    return collection


def product_name(product_dir: ProductDir) -> str:
    """The product's name (its collection's id): the directory's own name, resolved on local
    disk (`--out ./` or `--out tiles/..` name the directory they lead to, not "." or "..")."""
    if product_dir.local:
        name = Path(product_dir.root).resolve().name
    else:
        name = product_dir.url.rstrip("/").rsplit("/", 1)[-1]
    return name if name not in ("", ".", "..") else "landcover"


def mosaic_vrt(
    product_dir: ProductDir,
    records: Sequence[TileRecord],
    grid: OutputGrid,
    into: str,
    sources: Sequence[str],
) -> str:
    """A VRT of the whole grid over every tile (paths relative to the VRT), written in `into`:
    GDAL's VRT of the first tile, widened to the grid, with one source per tile, and the
    tiles' images (`sources`) as its sources tag."""
    first = product_dir.fetch(f"{records[0].name}.tif", into)

    def product_tags(root: ET.Element) -> None:
        for item in root.iterfind("Metadata/MDI"):
            if item.get("key") == TAG_SOURCES:  # the first tile's: the mosaic's are all tiles'
                item.text = json.dumps([_absolute(p) for p in sources])
        for band in root.iter("VRTRasterBand"):
            for metadata in band.findall("Metadata"):  # the first tile's product key: a tile's
                for entry in metadata.findall("MDI"):
                    if entry.get("key") == TAG_PRODUCT:
                        metadata.remove(entry)
                if not len(metadata):
                    band.remove(metadata)

    tiles = [VrtTile(f"{r.name}.tif", *r.rect) for r in records]
    vrt = str(Path(into) / MOSAIC)
    write_tile_vrt(
        vrt,
        first,
        tiles,
        transform=grid.transform,
        width=grid.width,
        height=grid.height,
        edit=product_tags,
    )
    return vrt


def _absolute(path: str) -> str:
    return os.path.abspath(path) if is_local(path) and "://" not in path else path


def _model_fields(meta: ModelMeta, model: str) -> dict[str, Any]:
    metrics = {k: meta.training[k] for k in MODEL_METRICS if k in meta.training}
    return {
        "file": Path(model).name,
        "architecture": meta.architecture,
        "class_map": meta.class_map.name,
        "bands": list(meta.band_names),
        "chip_size": meta.chip_size,
        "resolution_m": meta.resolution_m,
        "metrics": metrics,
    }


def _times(item: pystac.Item) -> list[Any]:
    common = item.common_metadata
    return [t for t in (item.datetime, common.start_datetime, common.end_datetime) if t]


# Items at <dir>/<tile>.json, beside their COGs (the asset hrefs are ./<tile>.tif).
_ITEMS_BESIDE_TILES = CustomLayoutStrategy(
    item_func=lambda item, parent_dir: f"{parent_dir}/{item.id}.json"
)
