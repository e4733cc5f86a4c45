"""A STAC item describing a land-cover COG, so catalogs and STAC tools can find and read it.

Built with pystac from the COG itself (its grid, and the model's class table that prediction
writes into its tags) and from the STAC items it was predicted from, when there were any:

- geometry and bbox: the COG's footprint in EPSG:4326 (edges densified before transforming);
- time: `start_datetime`/`end_datetime` spanning the input items the COG read (`datetime`
  null; `items_read` picks them, for one COG and for each tile of a tiled product alike), or,
  for GeoTIFF inputs whose date is unknown, `datetime` = the time of writing; `created`
  always;
- projection extension (v2): `proj:code` (`EPSG:n`, or `proj:wkt2` for a CRS without one),
  `proj:shape`, `proj:transform`;
- raster extension on the asset: one band, `data_type` uint8, `nodata` 0, its resolution;
- classification extension on the asset: `classification:classes` from the model's class
  map (value, name as an identifier, title as written, `color_hint` as RRGGBB hex; code 0 is
  the nodata class);
- links: `derived_from` to each input item that has its own JSON; the asset's href is the
  COG, relative to the item file when both are local;
- `landcover:adapt` and `landcover:adapt_sha256` in the properties when the map was predicted
  with test-time adaptation (`landcover.prediction.adapt`): the method and its statistics'
  digest, from the COG's tags.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pystac
import rasterio
from pystac.extensions.classification import Classification, ClassificationExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import DataType, RasterBand, RasterExtension
from pystac.utils import make_relative_href
from rasterio.warp import transform_geom
from shapely.geometry import box, mapping, shape

from landcover.classes import NODATA_CODE
from landcover.errors import PredictionError
from landcover.outputs import check_output_file, write_text_atomic
from landcover.prediction.adaptspec import TAG_ADAPT, TAG_ADAPT_SHA256
from landcover.prediction.backends.inference import (
    TAG_CALIBRATION,
    TAG_CALIBRATION_SHA256,
    TAG_PRECISION,
)
from landcover.prediction.outgrid import TAG_CLASS_MAP
from tiling.sources.classes import ClassMap
from tiling.sources.stacquery import StacSource

ASSET_KEY = "landcover"
COG_MEDIA_TYPE = pystac.MediaType.COG
# Footprint edges are split into this many pieces before going to lon/lat, so the polygon
# follows the curved image of a UTM rectangle.
FOOTPRINT_SEGMENTS = 16


def check_stac_item_target(path: str, *, overwrite: bool) -> None:
    """Refuse, before any work, an item path that is a directory, that exists without
    --overwrite, or where no file can be created."""
    check_output_file(
        path, option="--stac-item", overwrite=overwrite, example="lc.json", what="the STAC item"
    )


def cog_item(
    cog: str,
    *,
    sources: Sequence[StacSource] = (),
    item_path: str | None = None,
    created: datetime | None = None,
) -> pystac.Item:
    """The STAC item of land-cover COG `cog` (see the module docstring for its fields)."""
    created = created or datetime.now(UTC)
    with rasterio.open(cog) as ds:
        crs, transform, height, width = ds.crs, ds.transform, ds.height, ds.width
        tags = ds.tags()
        class_map = _class_map(cog, tags)
        bounds = ds.bounds
    outline = box(*bounds)
    edge = max(bounds.right - bounds.left, bounds.top - bounds.bottom) / FOOTPRINT_SEGMENTS
    footprint = shape(transform_geom(crs, "EPSG:4326", mapping(outline.segmentize(edge))))
    starts = [s.start for s in sources if s.start is not None]
    ends = [s.end for s in sources if s.end is not None]
    properties: dict[str, Any] = {"created": _stamp(created)}
    if TAG_ADAPT in tags:  # test-time adaptation: the method and its statistics' digest
        properties["landcover:adapt"] = tags[TAG_ADAPT]
        properties["landcover:adapt_sha256"] = tags.get(TAG_ADAPT_SHA256, "")
    if TAG_CALIBRATION in tags:  # int8: the calibration store and its sample's digest
        properties["landcover:precision"] = tags.get(TAG_PRECISION, "")
        properties["landcover:calibration"] = tags[TAG_CALIBRATION]
        properties["landcover:calibration_sha256"] = tags.get(TAG_CALIBRATION_SHA256, "")
    if starts and ends:
        properties["start_datetime"] = _stamp(min(starts))
        properties["end_datetime"] = _stamp(max(ends))
    item = pystac.Item(
        id=Path(cog).stem,
        geometry=mapping(footprint),
        bbox=[float(v) for v in footprint.bounds],
        datetime=None if starts and ends else created,
        properties=properties,
    )
    projection = ProjectionExtension.ext(item, add_if_missing=True)
    epsg = crs.to_epsg()
    if epsg is not None:
        projection.epsg = epsg
    else:
        projection.code = None
        projection.wkt2 = crs.to_wkt()
    projection.shape = [height, width]
    projection.transform = list(transform)[:6]
    href = os.path.abspath(cog)
    if item_path is not None:
        href = make_relative_href(href, os.path.abspath(item_path))
    asset = pystac.Asset(
        href=href, media_type=COG_MEDIA_TYPE, roles=["data"], title="land cover classes"
    )
    item.add_asset(ASSET_KEY, asset)
    band = RasterBand.create(
        data_type=DataType.UINT8, nodata=NODATA_CODE, spatial_resolution=abs(transform.a)
    )
    RasterExtension.ext(asset, add_if_missing=True).bands = [band]
    ClassificationExtension.ext(asset, add_if_missing=True).classes = _classes(class_map)
    for source in sources:
        if source.self_href:
            item.add_link(pystac.Link("derived_from", source.self_href, pystac.MediaType.JSON))
    return item


def items_read(sources: Sequence[StacSource], paths: Iterable[str]) -> list[StacSource]:
    """Those of the input items `sources` whose asset is one of the images at `paths` (what a
    COG or a tile read): the items that date it and that it is derived from."""
    read = set(paths)
    return [s for s in sources if s.href in read]


def write_stac_item(
    path: str,
    cog: str,
    *,
    sources: Sequence[StacSource] = (),
    overwrite: bool = False,
) -> pystac.Item:
    """Write the STAC item of `cog` to `path` (atomically; without `overwrite`, never over a
    file that appeared since the check) and return it."""
    check_stac_item_target(path, overwrite=overwrite)
    item = cog_item(cog, sources=sources, item_path=path)
    item.set_self_href(os.path.abspath(path))
    write_text_atomic(path, json.dumps(item.to_dict(), indent=2) + "\n", overwrite=overwrite)
    return item


def _class_map(cog: str, tags: dict[str, str]) -> ClassMap:
    text = tags.get(TAG_CLASS_MAP)
    if text is None:
        raise PredictionError(
            f"{cog}: no {TAG_CLASS_MAP} tag, so not a landcover prediction; write its STAC "
            "item from `landcover predict ... --stac-item PATH`"
        )
    return ClassMap.from_json(json.loads(text))


def _classes(class_map: ClassMap) -> list[Classification]:
    return [
        Classification.create(
            value=c.code,
            name=re.sub(r"[^0-9A-Za-z_-]+", "_", c.name).strip("_") or f"class_{c.code}",
            title=c.name,
            color_hint="{:02X}{:02X}{:02X}".format(*c.color),
            nodata=True if c.code == NODATA_CODE else None,
        )
        for c in class_map.classes
    ]


def _stamp(when: datetime) -> str:
    return pystac.utils.datetime_to_str(when)
