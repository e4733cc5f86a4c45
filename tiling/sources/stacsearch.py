"""STAC API item searches (`--stac-api`), read page by page with pystac-client's requests.

The pages are followed here rather than by pystac-client, so that a search

- logs a line per page (how many items so far), since a large search takes minutes;
- stops at `StacSearch.max_items` with an error naming `--max-items`, before any work: a
  search cut short would choose among part of the items (the newest flight of a place may be
  on a page never read), so it is refused rather than used;
- stops with a warning when the API's `next` link repeats, or a page repeats items already
  read, instead of paging forever;
- refuses a page that is not JSON, has no `features` list, or holds a malformed item
  (`tiling.sources.stacdoc`), naming the page and the field.

An item that comes back twice (the same collection and id) is kept once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pystac

from tiling.errors import (
    SourceFormatError,
    SourceNotFoundError,
    TilingError,
)
from tiling.runtime.jsontext import json_syntax
from tiling.runtime.urls import remote_failure, storage_failure
from tiling.sources.stacdoc import check_item, describe_json
from tiling.sources.stacquery import StacSearch

if TYPE_CHECKING:
    from pystac_client.stac_api_io import StacApiIO

__all__ = ["REQUEST_TIMEOUT_S", "search_items"]

logger = logging.getLogger(__name__)

# a server that stops answering fails the search instead of hanging it
REQUEST_TIMEOUT_S = 60.0
_API_FIX = "the API answers with malformed STAC: narrow the search to leave the item out"
# A read that breaks off is retried; a refused connection or an unknown host is not (it
# would only give the same answer again, with a warning line each time).
_RETRIES = 5


def search_items(search: StacSearch) -> list[pystac.Item]:
    """Run a STAC API item search page by page (module docstring); an empty result is an
    error."""
    from pystac_client import Client
    from pystac_client.exceptions import APIError
    from pystac_client.stac_api_io import StacApiIO
    from urllib3.util.retry import Retry

    io = StacApiIO(
        timeout=REQUEST_TIMEOUT_S, max_retries=Retry(total=_RETRIES, connect=0, backoff_factor=0.5)
    )
    try:
        client = Client.open(search.url, stac_io=io)
        query = client.search(
            collections=list(search.collections),
            bbox=list(search.bbox) if search.bbox is not None else None,
            intersects=dict(search.intersects) if search.intersects is not None else None,
            datetime=search.datetime,
        )
        features = _read_pages(io, query.url, query.method, query.get_parameters(), search)
        items = [pystac.Item.from_dict(f, preserve_dict=False) for f in features]
    except (APIError, OSError, ValueError, pystac.STACError, NotImplementedError) as exc:
        if isinstance(exc, TilingError):
            raise
        name = f"--stac-api {search.url}: search failed"
        fix = "check the URL, --collection and --datetime"
        failure = remote_failure(search.url, exc, name=name)
        raise failure or storage_failure(name, exc, fix) from None
    if not items:
        raise SourceNotFoundError(
            f"STAC search of {search.describe()} found no items; widen --bbox or --datetime, "
            "or check the collection name"
        )
    return items


def _read_pages(
    io: StacApiIO,
    url: str,
    method: str | None,
    parameters: dict[str, Any],
    search: StacSearch,
) -> list[dict[str, Any]]:
    """The features of every page, from the first request to the last `next` link."""
    features: dict[tuple[Any, str], dict[str, Any]] = {}  # (collection, id): an item once
    followed: set[str] = set()
    request: str | pystac.Link = url
    number = 0
    while True:
        number += 1
        where = f"--stac-api {search.url} page {number}"
        page = _read_page(io, request, method, parameters, where)
        page_features = page.get("features")
        if not isinstance(page_features, list):
            raise SourceFormatError(
                f"{where}: 'features' is {describe_json(page_features)}, not a list; check "
                "that --stac-api is the root of a STAC API with item search"
            )
        for index, feature in enumerate(page_features):
            check_item(feature, where, index=index, fix=_API_FIX)
        new = {(f.get("collection"), f["id"]): f for f in page_features}
        if page_features and new.keys() <= features.keys():
            logger.warning(
                "%s repeats items of earlier pages; the search stops there with %d items "
                "(the API's next link loops)",
                where,
                len(features),
            )
            break
        features.update(new)
        logger.info("STAC search %s: page %d, %d items", search.url, number, len(features))
        if len(features) > search.max_items:
            raise TilingError(
                f"STAC search of {search.describe()} matched more than --max-items "
                f"{search.max_items} items; narrow --bbox or --datetime, or raise --max-items"
            )
        next_link = _next_link(page, where)
        if not page_features or next_link is None:
            break
        key = json.dumps(next_link, sort_keys=True, default=str)
        if key in followed:
            logger.warning(
                "%s links to a next page already read; the search stops there with %d items "
                "(the API's next link loops)",
                where,
                len(features),
            )
            break
        followed.add(key)
        request, method = pystac.Link.from_dict(dict(next_link)), None
    return list(features.values())


def _read_page(
    io: StacApiIO,
    request: str | pystac.Link,
    method: str | None,
    parameters: dict[str, Any],
    where: str,
) -> Mapping[str, Any]:
    """One page as JSON; a page that is not a JSON object is one line naming it."""
    try:
        if isinstance(request, pystac.Link):
            page = io.read_json(request, parameters=parameters)
        else:
            page = io.read_json(request, method=method, parameters=parameters)
    except json.JSONDecodeError as exc:
        raise SourceFormatError(
            f"{where}: the answer is not JSON ({json_syntax(exc)}); check that "
            "--stac-api is the root of a STAC API"
        ) from None
    if not isinstance(page, Mapping):
        raise SourceFormatError(f"{where}: the answer is {describe_json(page)}, not a JSON object")
    return page


def _next_link(page: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
    links = page.get("links", [])
    if not isinstance(links, list):
        raise SourceFormatError(f"{where}: 'links' is {describe_json(links)}, not a list of links")
    for link in links:
        if isinstance(link, Mapping) and link.get("rel") == "next":
            if not isinstance(link.get("href"), str) or not link["href"]:
                raise SourceFormatError(f"{where}: its 'next' link has no href")
            return link
    return None
