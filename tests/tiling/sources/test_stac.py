"""STAC inputs: saved searches, catalogs and API searches become rasters, one per place."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pystac
import pytest
import shapely.geometry

from tests.support.chipstores import snapshot
from tests.tiling.rasters import Scenes
from tests.tiling.stacfiles import (
    raster_item,
    stac_api,
    write_catalog,
    write_item_collection,
)
from tiling.errors import SourceFormatError, SourceNotFoundError, StorageAccessError
from tiling.sources.inputs import expand_inputs, resolve_inputs
from tiling.sources.stac import one_per_place
from tiling.sources.stacquery import StacOptions, StacSearch
from tiling.tiler.tile import TileConfig, tile


@pytest.fixture()
def older_a(scenes: Scenes, tmp_path: Path) -> Path:
    """A copy of image A standing in for an earlier flight of the same place."""
    old = tmp_path / "old" / "a_2018.tif"
    old.parent.mkdir()
    shutil.copy(scenes.images[0], old)
    return old


def test_a_saved_search_with_relative_hrefs_gives_its_rasters(
    scenes: Scenes, tmp_path: Path
) -> None:
    doc = tmp_path / "search" / "items.json"
    items = [
        raster_item(tif, item_id=tif.stem, year=2020, href=f"../naip-copy/{tif.name}")
        for tif in scenes.images
    ]
    shutil.copytree(scenes.root / "naip", tmp_path / "naip-copy")
    write_item_collection(items, doc)
    resolved = resolve_inputs([str(doc)])
    assert resolved.paths == tuple(str(tmp_path / "naip-copy" / t.name) for t in scenes.images)
    assert [s.item_id for s in resolved.stac_items] == ["a", "b"]
    assert resolved.stac_items[0].collection == "naip"


def test_the_newest_item_of_a_place_wins_unless_asked_otherwise(
    scenes: Scenes, older_a: Path, tmp_path: Path
) -> None:
    a, b = scenes.images
    doc = write_item_collection(
        [
            raster_item(older_a, item_id="a-2018", year=2018),
            raster_item(a, item_id="a-2021", year=2021),
            raster_item(b, item_id="b-2019", year=2019),
        ],
        tmp_path / "items.json",
    )
    assert expand_inputs([str(doc)]) == (str(a), str(b))
    assert expand_inputs([str(doc)], stac=StacOptions(pick="oldest")) == tuple(
        sorted((str(older_a), str(b)))
    )
    assert len(expand_inputs([str(doc)], stac=StacOptions(pick="all"))) == 3


def test_a_place_is_a_grid_code_when_both_items_have_one(scenes: Scenes) -> None:
    a, b = scenes.images
    # Disjoint footprints but one quarter-quad code: one place.
    same_code = [
        raster_item(a, item_id="x", year=2018, grid_code="DOQQ-3807619SE"),
        raster_item(b, item_id="y", year=2021, grid_code="DOQQ-3807619SE"),
    ]
    assert [i.id for i in one_per_place(same_code)] == ["y"]
    # One footprint, two codes: two places.
    two_codes = [
        raster_item(a, item_id="x", year=2018, grid_code="DOQQ-1"),
        raster_item(a, item_id="y", year=2021, grid_code="DOQQ-2"),
    ]
    assert len(one_per_place(two_codes)) == 2


def test_neighbours_that_only_share_an_edge_are_two_places(scenes: Scenes) -> None:
    a, b = scenes.images
    kept = one_per_place(
        [raster_item(a, item_id="a", year=2018), raster_item(b, item_id="b", year=2021)]
    )
    assert sorted(i.id for i in kept) == ["a", "b"]


def test_a_static_catalog_is_walked_down_to_its_items(
    scenes: Scenes, older_a: Path, tmp_path: Path
) -> None:
    a, b = scenes.images
    catalog = write_catalog(
        [
            raster_item(a, item_id="a-2021", year=2021),
            raster_item(older_a, item_id="a-2018", year=2018),
            raster_item(b, item_id="b-2020", year=2020),
        ],
        tmp_path / "catalog",
    )
    resolved = resolve_inputs([str(catalog)])
    assert resolved.paths == (str(a), str(b))
    assert all(s.self_href and s.self_href.endswith(".json") for s in resolved.stac_items)


def test_rasters_and_stac_files_mix(scenes: Scenes, tmp_path: Path) -> None:
    a, b = scenes.images
    doc = write_item_collection([raster_item(b, item_id="b", year=2020)], tmp_path / "b.geojson")
    assert expand_inputs([str(a), str(doc)]) == (str(a), str(b))


def test_tiling_from_stac_gives_the_store_tiling_the_geotiffs_gives(
    scenes: Scenes, older_a: Path, tmp_path: Path
) -> None:
    a, b = scenes.images
    doc = write_item_collection(
        [
            raster_item(older_a, item_id="a-2018", year=2018),
            raster_item(a, item_id="a-2021", year=2021),
            raster_item(b, item_id="b-2021", year=2021),
        ],
        tmp_path / "items.json",
    )
    options = {"chip_size": 64, "shard_size": 4, "val_fraction": 0.25, "workers": 1}
    from_tifs = tmp_path / "tifs.zarr"
    from_stac = tmp_path / "stac.zarr"
    tile(TileConfig(images=(str(scenes.root / "naip" / "*.tif"),), out=str(from_tifs), **options))
    paths = expand_inputs([str(doc)])
    tile(TileConfig(images=paths, out=str(from_stac), **options))
    assert snapshot(str(from_stac), {}) == snapshot(str(from_tifs), {})


def test_a_stac_api_search_runs_through_pystac_client(
    scenes: Scenes, older_a: Path, tmp_path: Path
) -> None:
    a, b = scenes.images
    items = [
        raster_item(older_a, item_id="a-2018", year=2018),
        raster_item(a, item_id="a-2021", year=2021),
        raster_item(b, item_id="b-2021", year=2021),
        raster_item(b, item_id="other", year=2022, collection="landsat"),
    ]
    with stac_api(items) as (url, requests):
        search = StacSearch(url, ("naip",), bbox=(-76.6, 39.0, -76.5, 39.1), datetime="2018/2021")
        resolved = resolve_inputs([], stac=StacOptions(search=search))
    assert resolved.paths == (str(a), str(b))
    assert requests[0]["collections"] == ["naip"]
    assert requests[0]["bbox"] == [-76.6, 39.0, -76.5, 39.1]
    assert requests[0]["datetime"].startswith("2018-01-01T00:00:00")


def test_a_search_that_finds_nothing_says_so(tmp_path: Path) -> None:
    with stac_api([]) as (url, _):
        search = StacSearch(url, ("naip",), bbox=(-76.6, 39.0, -76.5, 39.1))
        with pytest.raises(SourceNotFoundError, match=r"found no items; widen --bbox"):
            resolve_inputs([], stac=StacOptions(search=search))


def test_an_api_that_does_not_answer_is_one_line() -> None:
    search = StacSearch("http://127.0.0.1:9/", ("naip",), bbox=(0.0, 0.0, 1.0, 1.0))
    with pytest.raises(StorageAccessError, match=r"--stac-api http://127.0.0.1:9/: search failed"):
        resolve_inputs([], stac=StacOptions(search=search))


def test_an_item_without_the_asset_names_the_assets_it_has(scenes: Scenes, tmp_path: Path) -> None:
    item = raster_item(scenes.images[0], item_id="a", year=2020, asset="visual")
    doc = write_item_collection([item], tmp_path / "items.json")
    with pytest.raises(
        SourceFormatError, match=r"item a .* has no asset 'image' \(its assets: visual\)"
    ):
        expand_inputs([str(doc)])
    assert expand_inputs([str(doc)], stac=StacOptions(asset="visual")) == (str(scenes.images[0]),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"type": "Polygon", "coordinates": []}', r"JSON but not STAC \(type 'Polygon'\)"),
        ("[1, 2]", r"JSON but not STAC \(type None\)"),
        ("{not json", r"not JSON \("),
    ],
)
def test_a_json_that_is_not_stac_is_refused(tmp_path: Path, text: str, message: str) -> None:
    doc = tmp_path / "region.json"
    doc.write_text(text)
    with pytest.raises(SourceFormatError, match=message):
        expand_inputs([str(doc)])


def test_a_missing_stac_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"STAC file .*nope.json does not exist"):
        expand_inputs([str(tmp_path / "nope.json")])


def test_http_urls_are_taken_as_they_are() -> None:
    signed = "https://example.invalid/naip/a.tif?st=2024&sig=a%2Bb"
    assert expand_inputs([signed]) == (signed,)


def test_an_item_json_is_one_item(scenes: Scenes, tmp_path: Path) -> None:
    item = raster_item(scenes.images[1], item_id="b", year=2020)
    path = tmp_path / "b-item.json"
    path.write_text(json.dumps(item.to_dict()))
    assert expand_inputs([str(path)]) == (str(scenes.images[1]),)


def test_thousands_of_items_keep_what_the_pairwise_rule_keeps_on_a_sample() -> None:
    """2,000 items over 1,000 places (repeat flights, slightly shifted; grid codes on some,
    bbox only on some): each sampled item is kept exactly when no item kept before it (newest
    first) is the same place by the rule of the module docstring, checked pair by pair."""
    rng = np.random.default_rng(0)
    base = datetime(2010, 1, 1, tzinfo=UTC)
    items, boxes = [], {}
    for k in range(2000):
        place = int(rng.integers(0, 1000))
        west = (place % 40) * 0.06 + rng.uniform(-0.004, 0.004)
        south = (place // 40) * 0.06 + rng.uniform(-0.004, 0.004)
        footprint = shapely.geometry.box(west, south, west + 0.0625, south + 0.0625)
        geometry = None if rng.random() < 0.1 else shapely.geometry.mapping(footprint)
        code = f"Q{place}" if rng.random() < 0.5 else None
        props = {} if code is None else {"grid:code": code}
        boxes[f"i{k}"] = footprint
        items.append(pystac.Item(f"i{k}", geometry, list(footprint.bounds),
                                 base + timedelta(hours=k), props))  # fmt: skip
    kept = {item.id for item in one_per_place(items)}
    assert 1000 > len(kept) > 200
    newest_first = items[::-1]  # item k flew k hours after the first

    def same_place(a: pystac.Item, b: pystac.Item) -> bool:
        code_a, code_b = a.properties.get("grid:code"), b.properties.get("grid:code")
        if code_a is not None and code_b is not None:
            return bool(code_a == code_b)
        fa, fb = boxes[a.id], boxes[b.id]
        return bool(fa.intersection(fb).area > 0.5 * min(fa.area, fb.area))

    for i in rng.choice(len(items), 25, replace=False):
        item = newest_first[int(i)]
        before = [other for other in newest_first[: int(i)] if other.id in kept]
        assert (item.id in kept) == (not any(same_place(item, other) for other in before))
