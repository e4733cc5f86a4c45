"""STAC documents checked field by field before pystac reads them.

pystac reads what it is given: a missing `id` becomes None, an asset href of 5 fails deep in
path handling, a `bbox` of text fails in shapely, and an empty href resolves to the directory
of the document. Each document a command reads (a saved search, an item, a catalog or
collection and every child it links, a page of an API search) is checked here first, so that
a malformed one is one line naming the document, the item and the field. The fields checked
are those the STAC spec requires and those landcover reads: an item's `id`, `geometry` and
`bbox` (footprints decide which items are the same place), `properties` and its dates (which
item of a place is newest), `assets` and their hrefs, `links`; the projection fields' types; a
catalog's `id`, `description` and `links`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pystac
import shapely.geometry
from pystac.utils import str_to_datetime
from shapely.errors import GEOSException

from tiling.errors import SourceFormatError

__all__ = [
    "BAND_FIELDS",
    "ITEM_COLLECTION_TYPES",
    "asset_href",
    "check_document",
    "check_item",
    "describe_json",
    "item_name",
]

ITEM_COLLECTION_TYPES = ("FeatureCollection",)
# where an asset (or its item) lists its bands: STAC 1.1's `bands`, the eo and raster extensions
BAND_FIELDS = ("bands", "eo:bands", "raster:bands")
_DATE_FIELDS = ("datetime", "start_datetime", "end_datetime")
_FIX = "fix the document or leave it out"

# builds the error for (field, problem), naming the document and the item
_Bad = Callable[[str, str], SourceFormatError]


def item_name(data: Any, where: str, index: int | None = None) -> str:
    """How messages name an item: `STAC item ID (from WHERE)`, or its place in the document
    when it has no usable id."""
    item_id = data.get("id") if isinstance(data, Mapping) else None
    if isinstance(item_id, str) and item_id:
        return f"STAC item {item_id} (from {where})"
    return f"features[{index}] of {where}" if index is not None else f"the STAC item in {where}"


def check_document(data: Any, where: str) -> None:
    """Refuse a malformed STAC document (`where` names it): an ItemCollection's `features` and
    each item in it, an item, or a catalog / collection and its links."""
    if not isinstance(data, Mapping):
        return  # not STAC at all: the reader says what it expects
    kind = data.get("type")
    if kind in ITEM_COLLECTION_TYPES:
        features = data.get("features")
        if not isinstance(features, list):
            raise SourceFormatError(
                f"{where}: 'features' is {describe_json(features)}, not a list of STAC "
                f"items; {_FIX}"
            )
        for index, feature in enumerate(features):
            check_item(feature, where, index=index)
    elif kind == "Feature":
        check_item(data, where)
    elif kind in ("Catalog", "Collection"):
        _check_catalog(data, where, kind)


def check_item(data: Any, where: str, *, index: int | None = None, fix: str = _FIX) -> None:
    """Refuse a malformed STAC item (`index`: its place among a document's features; `fix`:
    what the message tells the user to do)."""
    who = item_name(data, where, index)
    if not isinstance(data, Mapping):
        raise SourceFormatError(
            f"{who}: is {describe_json(data)}, not a STAC item (a JSON object); {fix}"
        )

    def bad(field: str, problem: str) -> SourceFormatError:
        return SourceFormatError(f"{who}: {field!r} {problem}; {fix}")

    if data.get("type") != "Feature":
        raise bad("type", f"is {describe_json(data.get('type'))}, not 'Feature'")
    if not isinstance(data.get("id"), str) or not data["id"]:
        raise bad("id", f"is {describe_json(data.get('id'))}, not a non-empty string")
    if "geometry" not in data:
        raise bad("geometry", "is missing (a GeoJSON geometry, or null)")
    geometry = data["geometry"]
    if geometry is not None:
        _check_geometry(geometry, bad)
        if "bbox" not in data:
            raise bad("bbox", "is missing (STAC requires it with a geometry)")
    if "bbox" in data:
        _check_numbers(data["bbox"], (4, 6), "bbox", bad)
    properties = data.get("properties")
    if not isinstance(properties, Mapping):
        raise bad("properties", f"is {describe_json(properties)}, not an object")
    _check_dates(properties, bad)
    _check_projection(properties, "properties.", bad)
    _check_bands(properties, "properties.", bad)
    assets = data.get("assets")
    if not isinstance(assets, Mapping):
        raise bad("assets", f"is {describe_json(assets)}, not an object of assets")
    for key, asset in assets.items():
        field = f"assets.{key}"
        if not isinstance(asset, Mapping):
            raise bad(field, f"is {describe_json(asset)}, not an asset object with an href")
        if not isinstance(asset.get("href"), str):
            raise bad(f"{field}.href", f"is {describe_json(asset.get('href'))}, not a path or URL")
        _check_projection(asset, f"{field}.", bad)
        _check_bands(asset, f"{field}.", bad)
    _check_links(data, bad)
    if data.get("collection") is not None and not isinstance(data["collection"], str):
        raise bad("collection", f"is {describe_json(data['collection'])}, not a string")
    extensions = data.get("stac_extensions", [])
    if not isinstance(extensions, list) or not all(isinstance(e, str) for e in extensions):
        raise bad("stac_extensions", f"is {describe_json(extensions)}, not a list of schema URLs")


def asset_href(item: pystac.Item, key: str, where: str, *, bands: int | None = None) -> str:
    """The href of asset `key` of a checked item; SourceFormatError when it is empty, or when
    the asset (or its item) lists other than `bands` bands (images: R, G, B, NIR)."""
    asset = item.assets[key]
    who = f"STAC item {item.id} (from {where})"
    if not asset.href.strip():
        raise SourceFormatError(
            f"{who}: asset {key!r} has an empty href; give it the GeoTIFF's path or URL, or "
            "pass --stac-asset with another asset"
        )
    if bands is None:
        return asset.href
    for name, fields in (("assets." + key, asset.extra_fields), ("properties", item.properties)):
        for band_field in BAND_FIELDS:
            listed = fields.get(band_field)
            if isinstance(listed, list) and len(listed) != bands:
                raise SourceFormatError(
                    f"{who}: asset {key!r} has {len(listed)} bands ({name}.{band_field}); "
                    f"landcover reads {bands}-band (R, G, B, NIR) imagery: pass --stac-asset "
                    f"with a {bands}-band asset"
                )
    return asset.href


def _check_catalog(data: Mapping[str, Any], where: str, kind: str) -> None:
    def bad(field: str, problem: str) -> SourceFormatError:
        return SourceFormatError(f"{where}: {kind.lower()} {field!r} {problem}; {_FIX}")

    required = ("id", "description", "stac_version") + (
        ("license",) if kind == "Collection" else ()
    )
    for field in required:
        if not isinstance(data.get(field), str) or not data[field]:
            raise bad(field, f"is {describe_json(data.get(field))}, not a non-empty string")
    if "links" not in data:
        raise bad("links", "is missing (the list that leads to its items)")
    _check_links(data, bad)


def _check_links(data: Mapping[str, Any], bad: _Bad) -> None:
    links = data.get("links", [])
    if not isinstance(links, list):
        raise bad("links", f"is {describe_json(links)}, not a list of links")
    for index, link in enumerate(links):
        if not isinstance(link, Mapping):
            raise bad(f"links[{index}]", f"is {describe_json(link)}, not a link object")
        for field in ("rel", "href"):
            if not isinstance(link.get(field), str) or not link[field]:
                raise bad(
                    f"links[{index}].{field}", f"is {describe_json(link.get(field))}, not a string"
                )


def _check_geometry(geometry: Any, bad: _Bad) -> None:
    if not isinstance(geometry, Mapping):
        raise bad("geometry", f"is {describe_json(geometry)}, not a GeoJSON geometry")
    try:
        shape = shapely.geometry.shape(geometry)
    except (GEOSException, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise bad("geometry", f"is not a valid GeoJSON geometry ({reason})") from None
    if shape.is_empty:
        raise bad("geometry", "is empty")


def _check_numbers(value: Any, lengths: Sequence[int], field: str, bad: _Bad) -> None:
    numbers = isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    )
    if not numbers or len(value) not in lengths:
        sizes = " or ".join(str(n) for n in lengths)
        raise bad(field, f"is {describe_json(value)}, not a list of {sizes} numbers")


def _check_dates(properties: Mapping[str, Any], bad: _Bad) -> None:
    for field in _DATE_FIELDS:
        value = properties.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad(f"properties.{field}", f"is {describe_json(value)}, not an RFC 3339 date")
        try:
            str_to_datetime(value)
        except (ValueError, OverflowError):
            raise bad(
                f"properties.{field}", f"is {value!r}, not an RFC 3339 date (2020-06-01T00:00:00Z)"
            ) from None
    if properties.get("datetime") is None and not (
        properties.get("start_datetime") and properties.get("end_datetime")
    ):
        raise bad(
            "properties.datetime",
            "is missing or null without start_datetime and end_datetime (STAC needs one)",
        )


def _check_projection(fields: Mapping[str, Any], prefix: str, bad: _Bad) -> None:
    epsg = fields.get("proj:epsg")
    if epsg is not None and (not isinstance(epsg, int) or isinstance(epsg, bool)):
        raise bad(f"{prefix}proj:epsg", f"is {describe_json(epsg)}, not an EPSG code (an integer)")
    for text_field in ("proj:code", "proj:wkt2"):
        value = fields.get(text_field)
        if value is not None and not isinstance(value, str):
            raise bad(f"{prefix}{text_field}", f"is {describe_json(value)}, not a string")
    shape = fields.get("proj:shape")
    if shape is not None and not (
        isinstance(shape, list)
        and len(shape) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
    ):
        raise bad(f"{prefix}proj:shape", f"is {describe_json(shape)}, not [rows, columns]")
    for field, lengths in (("proj:transform", (6, 9)), ("proj:bbox", (4, 6))):
        if fields.get(field) is not None:
            _check_numbers(fields[field], lengths, prefix + field, bad)


def _check_bands(fields: Mapping[str, Any], prefix: str, bad: _Bad) -> None:
    for field in BAND_FIELDS:
        bands = fields.get(field)
        if bands is not None and not isinstance(bands, list):
            raise bad(f"{prefix}{field}", f"is {describe_json(bands)}, not a list of bands")


def describe_json(value: Any) -> str:
    """A JSON value as a message shows it: "missing or null", "an object", or its text,
    shortened."""
    if value is None:
        return "missing or null"
    if isinstance(value, Mapping):
        return "an object"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
