"""STAC inputs: saved searches, static catalogs and STAC API searches → one raster href per place.

Wherever a command takes GeoTIFFs it also takes a STAC document (`*.json` / `*.geojson`: an
ItemCollection or FeatureCollection such as a saved search, a single item, or a static
`catalog.json` / `collection.json` whose items are walked) and a STAC API search
(`StacSearch`, paged in `tiling.sources.stacsearch`). Every document read, a catalog's children
included, is checked field by field first (`tiling.sources.stacdoc`). Each item gives the href of
one asset (`image` by default); relative hrefs are resolved against the document that holds them,
and the href is then opened like any other path or URL (fsspec/GDAL). Signing URLs (e.g. the
Planetary Computer's SAS tokens) is the caller's business: sign them before saving the search.

Repeat coverage of one place (NAIP is flown every two or three years) must not double up, so
one item is kept per *place* (`one_per_place`). Two items are the same place when

1. both carry the STAC grid extension's `grid:code` (NAIP: the quarter-quad, `DOQQ-...`) and
   the codes are equal; otherwise
2. their footprints (geometry, else bbox, in lon/lat) overlap by more than
   `SAME_PLACE_OVERLAP` (half) of the smaller footprint's area.

The newest item of a place is kept by default (`pick="oldest"` keeps the oldest, `"all"`
keeps every item). Items are ranked by date (`end_datetime`, else `datetime`, else
`start_datetime`; undated items rank last), then by id, and kept greedily: an item is dropped
when it is the same place as one already kept. Kept items are returned sorted by href, so a
STAC input lists its rasters in the order a glob of the same files does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import fsspec
import pystac
import shapely.geometry
from pystac.stac_io import DefaultStacIO
from pystac.utils import make_absolute_href
from shapely import STRtree
from shapely.geometry.base import BaseGeometry

from tiling.errors import SourceFormatError, SourceNotFoundError, TilingError
from tiling.runtime.jsontext import parse_json
from tiling.runtime.urls import is_local, local_path, remote_failure, storage_errors
from tiling.sources.stacdoc import asset_href, check_document
from tiling.sources.stacquery import StacOptions, StacSource
from tiling.sources.stacsearch import search_items

logger = logging.getLogger(__name__)

# Footprints overlapping by more than this share of the smaller one are the same place:
# neighbouring NAIP quarter-quads share only their ~300 m buffers (well under half).
SAME_PLACE_OVERLAP = 0.5


def stac_sources(
    documents: Sequence[str],
    options: StacOptions,
    *,
    storage_options: Mapping[str, Any] | None = None,
    bands: int | None = None,
) -> tuple[StacSource, ...]:
    """The chosen items of `documents` and of `options.search`, one per place, sorted by href;
    `bands`: the bands the assets must have where they list theirs (None: any)."""
    io = FsspecStacIO(storage_options)
    items: list[tuple[pystac.Item, str]] = []
    for document in documents:
        items.extend((item, document) for item in read_items(document, io))
    if options.search is not None:
        items.extend((item, options.search.url) for item in search_items(options.search))
    chosen = one_per_place([item for item, _ in items], options.pick)
    kept = {id(item) for item in chosen}
    sources = [
        _source(item, where, options.asset, bands) for item, where in items if id(item) in kept
    ]
    dropped = len(items) - len(sources)
    if dropped:
        logger.info("STAC: kept %d items, %d repeat(s) of a place dropped", len(sources), dropped)
    return tuple(sorted(sources, key=lambda s: s.href))


class FsspecStacIO(DefaultStacIO):
    """pystac reads through fsspec, so catalogs on az:// (or any fsspec URL) work like rasters."""

    def __init__(self, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.storage_options = dict(storage_options or {})

    def read_text_from_href(self, href: str) -> str:
        if is_local(href):
            try:
                return local_path(href).read_text(encoding="utf-8")
            except FileNotFoundError:
                raise SourceNotFoundError(
                    f"STAC file {href} does not exist; check the path"
                ) from None
        try:
            with storage_errors(href), fsspec.open(href, "r", **self.storage_options) as f:
                return str(f.read())
        except FileNotFoundError as exc:  # fsspec's HTTP says so for a 404 and a dead host
            raise remote_failure(href, exc) or SourceNotFoundError(
                f"STAC file {href} does not exist; check the URL"
            ) from None

    def read_json(self, source: pystac.link.HREF, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The JSON of a document, checked (`tiling.sources.stacdoc`): a malformed one, or a child
        that a catalog links, is one line naming it and the field."""
        href = str(source.href if isinstance(source, pystac.Link) else source)
        text = self.read_text(source, *args, **kwargs)
        data = parse_json(
            text,
            where=href,
            problem="not JSON",
            fix="pass a STAC ItemCollection, item, catalog.json or collection.json",
            error=SourceFormatError,
        )
        check_document(data, href)
        return data  # type: ignore[no-any-return]


def read_items(document: str, io: pystac.StacIO | None = None) -> list[pystac.Item]:
    """Every item of a STAC document: an ItemCollection, an item, or a catalog walked down."""
    io = io or FsspecStacIO()
    href = _absolute(document)
    try:
        data = io.read_json(href)
    except TilingError as exc:  # named by its absolute href: name it as it was given
        raise type(exc)(str(exc).replace(href, document, 1)) from None
    kind = data.get("type") if isinstance(data, dict) else None
    items: list[pystac.Item] | None = None
    try:
        if isinstance(data, dict) and pystac.ItemCollection.is_item_collection(data):
            # Items of a saved search rarely have a self link: relative asset hrefs are
            # resolved against the document instead (`_source`).
            items = list(pystac.ItemCollection.from_dict(data, preserve_dict=False))
        elif kind in ("Feature", "Catalog", "Collection"):
            stac_object = pystac.read_file(href, stac_io=io)
            if isinstance(stac_object, pystac.Item):
                items = [stac_object]
            elif isinstance(stac_object, pystac.Catalog):
                items = list(stac_object.get_items(recursive=True))
    except pystac.STACError as exc:
        # a child document that failed our checks: its own line, naming it and the field
        cause = next((e for e in _causes(exc) if isinstance(e, TilingError)), None)
        if cause is not None:
            raise type(cause)(f"{cause} (reached from {document})") from None
        raise SourceFormatError(f"{document}: not valid STAC ({exc})") from None
    except TilingError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # what the checks miss
        raise SourceFormatError(
            f"{document}: not valid STAC ({type(exc).__name__}: {exc}); fix the document or "
            "leave it out"
        ) from None
    if items is None:
        raise SourceFormatError(
            f"{document}: JSON but not STAC (type {kind!r}); pass a STAC ItemCollection / "
            "FeatureCollection of items, an item, a catalog.json or a collection.json"
        )
    if not items:
        raise SourceFormatError(
            f"{document}: holds no STAC items ({kind or 'FeatureCollection'} without items); "
            "pass a document that lists the images"
        )
    return items


def _causes(exc: BaseException) -> list[BaseException]:
    """The exceptions `exc` was raised from, innermost last."""
    chain: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def item_dates(item: pystac.Item) -> tuple[datetime | None, datetime | None]:
    """(start, end) of an item: its datetime, or its start/end range."""
    meta = item.common_metadata
    start = meta.start_datetime or item.datetime or meta.end_datetime
    end = meta.end_datetime or item.datetime or meta.start_datetime
    return start, end


def one_per_place(items: Iterable[pystac.Item], pick: str = "newest") -> list[pystac.Item]:
    """One item per place (see the module docstring for the rule), the newest by default."""
    items = list(items)
    if pick == "all":
        return items
    newest_first = pick == "newest"

    def rank(item: pystac.Item) -> tuple[int, float, str]:
        _, end = item_dates(item)
        if end is None:
            return (1, 0.0, item.id)  # undated: last
        stamp = end.timestamp()
        return (0, -stamp if newest_first else stamp, item.id)

    ordered = sorted(items, key=rank)
    footprints = [_footprint(item) for item in ordered]
    # Every item's footprint in one STRtree: an item is checked against the kept items whose
    # bounding boxes meet its own (two places overlap by area only then), not against every
    # kept item, so thousands of items cost O(N log N), not O(N^2).
    located = [i for i, footprint in enumerate(footprints) if footprint is not None]
    tree = STRtree([footprints[i] for i in located])
    kept = [False] * len(ordered)
    kept_codes: set[str] = set()  # equal grid codes are one place whatever the footprints
    for i, item in enumerate(ordered):
        code = item.properties.get("grid:code")
        if code is not None and _code_key(code) in kept_codes:
            continue
        footprint = footprints[i]
        if footprint is not None and any(
            kept[j] and _same_place(item, footprint, ordered[j], footprints[j])
            for j in (located[k] for k in tree.query(footprint))
        ):
            continue
        kept[i] = True
        if code is not None:
            kept_codes.add(_code_key(code))
    return [item for item, keep in zip(ordered, kept, strict=True) if keep]


def _code_key(code: Any) -> str:
    """A grid code as a set key: equal codes give equal keys (a code need not be a string)."""
    return json.dumps(code, sort_keys=True)


def _footprint(item: pystac.Item) -> BaseGeometry | None:
    if item.geometry is not None:
        return shapely.geometry.shape(item.geometry)
    bbox = list(item.bbox or [])
    if len(bbox) == 6:  # 3D: W, S, min z, E, N, max z
        bbox = [bbox[0], bbox[1], bbox[3], bbox[4]]
    if len(bbox) == 4:
        return shapely.geometry.box(*bbox)
    return None


def _same_place(
    a: pystac.Item, fa: BaseGeometry | None, b: pystac.Item, fb: BaseGeometry | None
) -> bool:
    code_a, code_b = a.properties.get("grid:code"), b.properties.get("grid:code")
    if code_a is not None and code_b is not None:
        return bool(code_a == code_b)
    if fa is None or fb is None:
        return False
    smaller = min(fa.area, fb.area)
    if smaller <= 0:
        return False
    return bool(fa.intersection(fb).area > SAME_PLACE_OVERLAP * smaller)


def _absolute(where: str) -> str:
    return str(local_path(where).absolute()) if is_local(where) else where


def _source(item: pystac.Item, where: str, asset: str, bands: int | None) -> StacSource:
    if asset not in item.assets:
        keys = ", ".join(sorted(item.assets)) or "none"
        raise SourceFormatError(
            f"STAC item {item.id} (from {item.get_self_href() or where}) has no asset "
            f"{asset!r} (its assets: {keys}); "
            "pass --stac-asset with one of those"
        )
    target = item.assets[asset]
    asset_href(item, asset, item.get_self_href() or where, bands=bands)  # empty: refused
    href = target.get_absolute_href() or make_absolute_href(target.href, _absolute(where))
    if href.startswith("file://"):
        href = str(local_path(href))
    start, end = item_dates(item)
    return StacSource(
        href=href,
        item_id=item.id,
        collection=item.collection_id,
        start=start,
        end=end,
        self_href=item.get_self_href(),
    )
