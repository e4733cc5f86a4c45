"""The STAC inputs of every command that reads them (`tile`, `predict`; `evaluate`'s truth):
a malformed document or API answer is one line naming it and the field, before any work; an
API search pages with a line per page, stops at a repeated page and at --max-items."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.landcover.cli.readers import READERS, Scene, one_error_line, run
from tests.tiling.stacfiles import paged, raster_item, stac_api

Doc = Any  # a JSON document (dict), or text that is not JSON


def item_dict(reader_scene: Scene, command: str, item_id: str = "scene") -> dict[str, Any]:
    return raster_item(reader_scene.raster(command), item_id=item_id, year=2021).to_dict()


def collection(*features: Any) -> dict[str, Any]:
    return {"type": "FeatureCollection", "features": list(features)}


def changed(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Doc]:
    """A saved search of one item, changed by `change`."""

    def document(item: dict[str, Any]) -> Doc:
        item = copy.deepcopy(item)
        change(item)
        return collection(item)

    return document


def catalog(**fields: Any) -> Callable[[dict[str, Any]], Doc]:
    base = {"type": "Catalog", "id": "c", "description": "d", "stac_version": "1.0.0",
            "links": []}  # fmt: skip
    return lambda item: {k: v for k, v in {**base, **fields}.items() if v is not None}


# (document from a valid item dict, text the error line must hold besides the document's name)
MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], Doc], str]] = {
    "empty href": (changed(lambda d: d["assets"]["image"].update(href="")),
                   "STAC item scene (from {doc}): asset 'image' has an empty href"),
    "no href": (changed(lambda d: d["assets"]["image"].pop("href")), "'assets.image.href'"),
    "href a number": (changed(lambda d: d["assets"]["image"].update(href=5)),
                      "'assets.image.href' is 5"),
    "assets a list": (changed(lambda d: d.update(assets=["x.tif"])), "'assets' is ['x.tif']"),
    "asset a string": (changed(lambda d: d["assets"].update(image="x.tif")), "'assets.image'"),
    "no id": (changed(lambda d: d.pop("id")), "features[0] of {doc}: 'id'"),
    "no geometry": (changed(lambda d: d.pop("geometry")), "'geometry' is missing"),
    "geometry text": (changed(lambda d: d.update(geometry="x")), "'geometry' is 'x'"),
    "no bbox": (changed(lambda d: d.pop("bbox")), "'bbox' is missing"),
    "bbox text": (changed(lambda d: d.update(bbox="1,2,3,4")), "'bbox' is '1,2,3,4'"),
    "bbox of 3": (changed(lambda d: d.update(bbox=[1, 2, 3])), "'bbox' is [1, 2, 3]"),
    "no properties": (changed(lambda d: d.pop("properties")), "'properties' is missing"),
    "bad datetime": (changed(lambda d: d["properties"].update(datetime="yesterday")),
                     "'properties.datetime' is 'yesterday'"),
    "proj:epsg text": (changed(lambda d: d["properties"].update({"proj:epsg": "utm"})),
                       "'properties.proj:epsg' is 'utm'"),
    "3 bands": (changed(lambda d: d["assets"]["image"].update({"eo:bands": [{}, {}, {}]})),
                "asset 'image' has 3 bands (assets.image.eo:bands)"),
    "links text": (changed(lambda d: d.update(links="x")), "'links' is 'x'"),
    "feature text": (lambda item: collection("x"), "features[0] of {doc}: is 'x'"),
    "no features": (lambda item: {"type": "FeatureCollection"}, "'features' is missing"),
    "features text": (lambda item: {"type": "FeatureCollection", "features": "x"},
                      "'features' is 'x'"),
    "no items": (lambda item: collection(), "holds no STAC items"),
    "not JSON": (lambda item: "{not json", "not JSON ("),
    "not STAC": (lambda item: [1, 2], "JSON but not STAC"),
    "catalog without links": (catalog(links=None), "catalog 'links' is missing"),
    "catalog link href a number": (catalog(links=[{"rel": "item", "href": 5}]),
                                   "catalog 'links[0].href' is 5"),
    "catalog without items": (catalog(), "holds no STAC items"),
}  # fmt: skip


def write_document(path: Path, document: Doc) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


# evaluate reads 1-band truth: the band count of its assets is open_label's to check
IMAGE_ONLY = {"3 bands"}


@pytest.mark.parametrize(
    ("command", "case"),
    [(c, case) for case in MALFORMED for c in READERS if c != "evaluate" or case not in IMAGE_ONLY],
)
def test_a_malformed_document_is_one_line_naming_it_and_the_field(
    reader_scene: Scene, tmp_path: Path, command: str, case: str
) -> None:
    make, expected = MALFORMED[case]
    doc = write_document(tmp_path / "items.json", make(item_dict(reader_scene, command)))
    line = one_error_line(run(reader_scene.args(command, [str(doc)], tmp_path / "out")))
    assert str(doc) in line
    assert expected.format(doc=doc) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize(
    ("child", "expected"),
    [
        (None, "STAC file {child} does not exist"),
        ("{not json", "{child}: not JSON ("),
        ({"type": "Feature", "id": 7}, "the STAC item in {child}: 'id' is 7"),
    ],
)
def test_a_catalog_names_the_child_at_fault(
    reader_scene: Scene, tmp_path: Path, command: str, child: Doc, expected: str
) -> None:
    child_path = tmp_path / "child.json"
    if child is not None:
        write_document(child_path, child)
    doc = write_document(
        tmp_path / "catalog.json", catalog(links=[{"rel": "item", "href": "child.json"}])({})
    )
    line = one_error_line(run(reader_scene.args(command, [str(doc)], tmp_path / "out")))
    assert expected.format(child=child_path) in line
    assert f"(reached from {doc})" in line or child is None


# What an API may answer to a search, and what the error line must hold.
BAD_PAGES: dict[str, tuple[Any, str]] = {
    "not JSON": ("{oops", "page 1: the answer is not JSON"),
    "a list": ("[1, 2]", "page 1: the answer is [1, 2], not a JSON object"),
    "no features": ({"type": "FeatureCollection", "links": []}, "page 1: 'features' is missing"),
    "features text": ({"type": "FeatureCollection", "features": "x"}, "page 1: 'features' is 'x'"),
    "an item without id": (collection({"type": "Feature", "id": 3}),
                           "features[0] of --stac-api {url} page 1: 'id' is 3"),
    "links text": ({"type": "FeatureCollection", "features": [], "links": "x"},
                   "page 1: 'links' is 'x'"),
}  # fmt: skip

SEARCHERS = ("tile", "predict")  # evaluate's truth takes no --stac-api


def search_args(reader_scene: Scene, command: str, url: str, out: Path, *extra: str) -> list[str]:
    area = ["--bbox", "-75.1,36,-74.9,36.2"]
    if command == "predict":  # predict's --bbox is its region, in --region-crs
        area += ["--region-crs", "EPSG:4326"]
    return reader_scene.args(
        command, [], out, "--stac-api", url, "--collection", "naip", *area, *extra
    )


@pytest.mark.parametrize("command", SEARCHERS)
@pytest.mark.parametrize("case", BAD_PAGES)
def test_a_malformed_api_answer_is_one_line_naming_the_page_and_the_field(
    reader_scene: Scene, tmp_path: Path, command: str, case: str
) -> None:
    page, expected = BAD_PAGES[case]
    with stac_api([], pages=[page]) as (url, _):
        line = one_error_line(run(search_args(reader_scene, command, url, tmp_path / "out")))
    assert f"--stac-api {url}" in line and expected.format(url=url) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", SEARCHERS)
def test_a_search_logs_each_page_stops_where_a_page_repeats_and_at_max_items(
    reader_scene: Scene, tmp_path: Path, command: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiling.sources.stacsearch")
    features = [item_dict(reader_scene, command, f"scene-{n}") for n in range(3)]
    looping = paged(features, 1)
    looping[2]["links"] = [{"rel": "next", "href": "{root}/search?page=1"}]  # back to page 2
    with stac_api([], pages=looping) as (url, _):
        result = run(search_args(reader_scene, command, url, tmp_path / "out"))
        assert result.exit_code == 0, result.output
        pages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert pages == [f"STAC search {url}: page {n}, {n} items" for n in (1, 2, 3)]
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.startswith(f"--stac-api {url} page 3 links to a next page already read")

        line = one_error_line(run(search_args(reader_scene, command, url, tmp_path / "o2",
                                              "--max-items", "2")))  # fmt: skip
    assert line.endswith("matched more than --max-items 2 items; narrow --bbox or --datetime, "
                         "or raise --max-items")  # fmt: skip
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("command", SEARCHERS)
def test_max_items_without_a_search_is_refused(
    reader_scene: Scene, tmp_path: Path, command: str
) -> None:
    args = reader_scene.args(
        command, [str(reader_scene.image)], tmp_path / "out", "--max-items", "5"
    )
    line = one_error_line(run(args))
    assert line == "error: --max-items applies only to a STAC API search; add --stac-api URL"
