"""STAC API searches page by page: items kept once, a page of items already read stops the
search (an API whose next link changes but whose pages repeat), an empty page ends it. The
commands' side (progress lines, a repeated next link, --max-items, malformed pages) is tested
in tests/landcover/cli/test_stacinputs.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.tiling.rasters import Scenes
from tests.tiling.stacfiles import paged, raster_item, stac_api
from tiling.sources.stacquery import StacSearch
from tiling.sources.stacsearch import search_items


def features(scenes: Scenes) -> list[dict[str, Any]]:
    return [raster_item(tif, item_id=tif.stem, year=2020).to_dict() for tif in scenes.images]


def search(url: str) -> list[str]:
    found = search_items(StacSearch(url, ("naip",), bbox=(-77.0, 38.0, -76.0, 40.0)))
    return [item.id for item in found]


def test_a_page_of_items_already_read_stops_the_search(
    scenes: Scenes, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = features(scenes)
    pages = paged([a, b], 1)
    # page 2 links on with a new token each time, to page 2 again
    pages[1]["links"] = [{"rel": "next", "href": "{root}/search?page=1&token=x"}]
    pages.append(pages[1])
    with stac_api([], pages=pages) as (url, _):
        assert search(url) == ["a", "b"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"--stac-api {url} page 3 repeats items of earlier pages")


def test_an_item_on_two_pages_is_kept_once_and_an_empty_page_ends_the_search(
    scenes: Scenes,
) -> None:
    a, b = features(scenes)
    pages = paged([a, a, b], 2)
    pages[1]["links"] = [{"rel": "next", "href": "{root}/search?page=2"}]
    pages.append({"type": "FeatureCollection", "features": [], "links": pages[1]["links"]})
    with stac_api([], pages=pages) as (url, requests):
        assert search(url) == ["a", "b"]
    assert len(requests) == 1  # the first page by POST, the rest by their next links
