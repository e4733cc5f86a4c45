"""STAC test files built with pystac around local GeoTIFFs: items, saved searches, catalogs,
and a minimal STAC API (landing page + /search) served from 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pystac
import rasterio
from rasterio.warp import transform_geom
from shapely.geometry import box, mapping, shape


def when(year: int) -> datetime:
    return datetime(year, 7, 1, tzinfo=UTC)


def raster_item(
    tif: Path,
    *,
    item_id: str,
    year: int,
    href: str | None = None,
    asset: str = "image",
    grid_code: str | None = None,
    collection: str | None = "naip",
) -> pystac.Item:
    """An item whose footprint is `tif`'s (in lon/lat) and whose `asset` points at it."""
    with rasterio.open(tif) as ds:
        footprint = transform_geom(ds.crs, "EPSG:4326", mapping(box(*ds.bounds)))
    geometry = shape(footprint)
    properties: dict[str, Any] = {"grid:code": grid_code} if grid_code else {}
    item = pystac.Item(
        id=item_id,
        geometry=mapping(geometry),
        bbox=list(geometry.bounds),
        datetime=when(year),
        properties=properties,
        collection=collection,
    )
    item.add_asset(
        asset,
        pystac.Asset(href=href or str(tif), media_type=pystac.MediaType.COG, roles=["data"]),
    )
    return item


def write_item_collection(items: Sequence[pystac.Item], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pystac.ItemCollection(items).save_object(dest_href=str(path))
    return path


def write_catalog(items: Sequence[pystac.Item], root: Path) -> Path:
    """A self-contained static catalog (relative hrefs) with the items one level down."""
    catalog = pystac.Catalog(id="test-catalog", description="test rasters")
    sub = pystac.Catalog(id="year", description="one level down")
    catalog.add_child(sub)
    for item in items:
        sub.add_item(item.clone())
    catalog.normalize_hrefs(str(root))
    catalog.save(catalog_type=pystac.CatalogType.SELF_CONTAINED)
    return root / "catalog.json"


def paged(features: Sequence[dict[str, Any]], page_size: int) -> list[dict[str, Any]]:
    """`features` as API pages of `page_size`, each but the last with a `next` link (GET)."""
    pages = []
    for start in range(0, max(len(features), 1), page_size):
        page: dict[str, Any] = {
            "type": "FeatureCollection",
            "features": list(features[start : start + page_size]),
            "links": [],
        }
        if start + page_size < len(features):
            number = start // page_size + 1
            page["links"] = [{"rel": "next", "href": f"{{root}}/search?page={number}"}]
        pages.append(page)
    return pages


@contextmanager
def stac_api(
    items: Sequence[pystac.Item], *, pages: Sequence[Any] | None = None
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A STAC API on 127.0.0.1 answering `/` and `/search` (GET or POST) with `items`.

    `pages`: the answers to `/search` instead, page N at `/search?page=N` (the first for a
    POST); a dict is sent as JSON with `{root}` in it replaced by the root URL, a string as
    it is. Yields the root URL and the list of search bodies received. Stopped on exit.
    """
    requests: list[dict[str, Any]] = []
    features = [item.to_dict() for item in items]

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: Any) -> None:
            root = f"http://{self.headers['Host']}"
            text = body if isinstance(body, str) else json.dumps(body).replace("{root}", root)
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            root = f"http://{self.headers['Host']}"
            if self.path.split("?")[0].rstrip("/") == "":
                self._send(
                    {
                        "type": "Catalog",
                        "id": "test-api",
                        "description": "test STAC API",
                        "stac_version": "1.0.0",
                        "conformsTo": [
                            "https://api.stacspec.org/v1.0.0/core",
                            "https://api.stacspec.org/v1.0.0/item-search",
                        ],
                        "links": [
                            {"rel": "self", "href": root + "/"},
                            {"rel": "root", "href": root + "/"},
                            {
                                "rel": "search",
                                "href": root + "/search",
                                "type": "application/geo+json",
                                "method": "POST",
                            },
                        ],
                    }
                )
            elif pages is not None and self.path.startswith("/search?page="):
                number = int(parse_qs(urlsplit(self.path).query)["page"][0])
                self._send(pages[min(number, len(pages) - 1)])
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            requests.append(body)
            if self.path.rstrip("/") != "/search":
                self.send_error(404)
                return
            if pages is not None:
                self._send(pages[0])
                return
            wanted = set(body.get("collections") or [])
            found = [f for f in features if not wanted or f.get("collection") in wanted]
            self._send({"type": "FeatureCollection", "features": found, "links": []})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
