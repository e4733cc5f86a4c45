"""What a STAC input asks for: options, searches and --bbox, checked before anything is read."""

from __future__ import annotations

import pytest

from tiling.errors import TilingError
from tiling.sources.stacquery import StacOptions, StacSearch, is_stac_document, parse_bbox


def test_a_search_needs_a_collection() -> None:
    with pytest.raises(TilingError, match=r"needs --collection NAME"):
        StacSearch("http://example.invalid/", ())


def test_bbox_text_is_checked() -> None:
    assert parse_bbox("-76.6,39,-76.5,39.1") == (-76.6, 39.0, -76.5, 39.1)
    with pytest.raises(TilingError, match=r"--bbox '1,2,3': expected four numbers"):
        parse_bbox("1,2,3")
    with pytest.raises(TilingError, match=r"need W < E"):
        parse_bbox("5,0,1,1")


def test_an_unknown_pick_names_the_choices() -> None:
    with pytest.raises(TilingError, match=r"--stac-pick 'latest': use one of newest, oldest, all"):
        StacOptions(pick="latest")


def test_stac_documents_are_known_by_their_suffix() -> None:
    assert is_stac_document("az://c/naip/search.JSON?sv=1")
    assert is_stac_document("catalog.geojson")
    assert not is_stac_document("naip/*.tif")
