"""`landcover predict` from STAC inputs, and the STAC item it writes for its COG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio
from click.testing import CliRunner, Result
from pystac.extensions.classification import ClassificationExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import RasterExtension

from landcover.cli import app as cli
from landcover.errors import PredictionError
from landcover.prediction.outgrid import TAG_CLASS_MAP
from landcover.prediction.stacitem import cog_item
from tests.landcover.prediction.inputs import CLASS_MAP, ORIGIN, pixels, write_image, write_model
from tests.tiling.stacfiles import raster_item, stac_api, when, write_catalog, write_item_collection

# The scene fixture covers x 500000..500090, y 3999925..4000000 in UTM 18N.
SCENE_BBOX_LONLAT = "-75.0,36.1,-74.99,36.2"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model") / "model.pt", constant_class=2)


@pytest.fixture()
def older(scene: Path, tmp_path: Path) -> Path:
    """Another flight of the scene's place: same footprint, other pixels, older."""
    return write_image(tmp_path / "older.tif", pixels(75, 90, seed=9))


def predict(model: Path, *args: str) -> Result:
    return CliRunner().invoke(cli.main, ["predict", str(model), *args, "--device", "cpu"])


def test_predict_from_a_catalog_writes_a_stac_item_of_its_cog(
    model: Path, scene: Path, older: Path, tmp_path: Path
) -> None:
    catalog = write_catalog(
        [
            raster_item(older, item_id="scene-2018", year=2018),
            raster_item(scene, item_id="scene-2021", year=2021),
        ],
        tmp_path / "catalog",
    )
    out, item_path = tmp_path / "lc.tif", tmp_path / "lc.json"
    result = predict(model, str(catalog), "--out", str(out), "--stac-item", str(item_path))
    assert result.exit_code == 0, result.output
    assert f"wrote {item_path}" in result.output
    assert "from 1 image(s)" in result.output  # the 2018 flight of the same place is dropped

    item = pystac.Item.from_file(str(item_path))
    assert item.datetime is None
    assert item.common_metadata.start_datetime == when(2021)
    assert item.common_metadata.end_datetime == when(2021)
    assert item.common_metadata.created is not None
    [derived] = item.get_links("derived_from")
    assert derived.href.endswith("scene-2021.json")
    asset = item.assets["landcover"]
    assert Path(asset.get_absolute_href() or "") == out
    assert asset.href == "./lc.tif"  # relative: the pair can move together
    with rasterio.open(out) as ds:
        proj = ProjectionExtension.ext(item)
        assert proj.code == "EPSG:32618"
        assert proj.shape == [ds.height, ds.width]
        assert proj.transform == list(ds.transform)[:6]
        lon, lat = rasterio.warp.transform(ds.crs, "EPSG:4326", [ds.bounds.left], [ds.bounds.top])
    assert item.bbox is not None
    assert item.bbox[0] == pytest.approx(lon[0], abs=1e-6)
    assert item.bbox[3] == pytest.approx(lat[0], abs=1e-6)
    [band] = RasterExtension.ext(asset).bands or []
    assert (band.data_type, band.nodata, band.spatial_resolution) == ("uint8", 0, 1.0)
    classes = ClassificationExtension.ext(asset).classes or []
    assert [c.value for c in classes] == [c.code for c in CLASS_MAP.classes]
    assert [c.title for c in classes] == CLASS_MAP.class_names
    assert classes[0].nodata is True
    r, g, b = CLASS_MAP.classes[2].color
    assert classes[2].color_hint == f"{r:02X}{g:02X}{b:02X}"
    assert all(c.name and " " not in c.name for c in classes)
    # Round trip through pystac keeps every extension field (validate() would fetch schemas).
    written = json.loads(item_path.read_text())
    again = pystac.Item.from_dict(written).to_dict()
    assert again.pop("links") == [
        *[link for link in written.pop("links") if link["rel"] != "self"],
        {"rel": "self", "href": str(item_path), "type": "application/json"},
    ]
    assert again == written
    loaded = pystac.Item.from_file(str(item_path))
    for extension in (ProjectionExtension, RasterExtension, ClassificationExtension):
        assert extension.has_extension(loaded)


def test_predict_from_a_saved_search_equals_predict_from_the_geotiff(
    model: Path, scene: Path, older: Path, tmp_path: Path
) -> None:
    doc = write_item_collection(
        [
            raster_item(older, item_id="old", year=2018),
            raster_item(scene, item_id="new", year=2021),
        ],
        tmp_path / "search.json",
    )
    from_tif, from_stac = tmp_path / "tif.tif", tmp_path / "stac.tif"
    assert predict(model, str(scene), "--out", str(from_tif)).exit_code == 0
    result = predict(model, str(doc), "--out", str(from_stac))
    assert result.exit_code == 0, result.output
    with rasterio.open(from_tif) as a, rasterio.open(from_stac) as b:
        np.testing.assert_array_equal(a.read(), b.read())
        assert a.transform == b.transform


def test_predict_searches_a_stac_api_over_its_region(
    model: Path, scene: Path, older: Path, tmp_path: Path
) -> None:
    items = [
        raster_item(older, item_id="old", year=2018),
        raster_item(scene, item_id="new", year=2021),
    ]
    out = tmp_path / "lc.tif"
    bbox = f"{ORIGIN[0] + 10},{ORIGIN[1] - 60},{ORIGIN[0] + 80},{ORIGIN[1] - 10}"
    with stac_api(items) as (url, requests):
        result = predict(
            model,
            *("--stac-api", url, "--collection", "naip", "--datetime", "2018/2021"),
            *("--bbox", bbox, "--region-crs", "EPSG:32618"),
            *("--out", str(out), "--stac-item", str(tmp_path / "lc.json")),
        )
    assert result.exit_code == 0, result.output
    [body] = requests
    assert body["intersects"]["type"] == "Polygon"
    assert body["collections"] == ["naip"]
    item = json.loads((tmp_path / "lc.json").read_text())
    assert item["properties"]["start_datetime"].startswith("2021-07-01")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--stac-api", "http://127.0.0.1:9/", "--collection", "naip"), "give --region or --bbox"),
        (("IMG", "--collection", "naip"), "--collection applies only to a STAC API search"),
        (("--stac-api", "http://127.0.0.1:9/", "--bbox", "0,0,1,1"), "needs --collection NAME"),
        ((), "Missing argument 'IMAGES...'"),
    ],
)
def test_stac_options_that_cannot_work_are_one_line(
    model: Path, scene: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    args = tuple(str(scene) if a == "IMG" else a for a in args)
    result = predict(model, *args, "--out", str(tmp_path / "lc.tif"))
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "lc.tif").exists()


def test_an_existing_stac_item_is_refused_before_the_work(
    model: Path, scene: Path, tmp_path: Path
) -> None:
    item_path = tmp_path / "lc.json"
    item_path.write_text("{}")
    result = predict(
        model, str(scene), "--out", str(tmp_path / "lc.tif"), "--stac-item", str(item_path)
    )
    assert result.exit_code == 2
    assert f"{item_path} exists; pass --overwrite to replace the STAC item" in result.output
    assert not (tmp_path / "lc.tif").exists()


def test_a_crs_without_an_epsg_code_is_written_as_wkt2(tmp_path: Path) -> None:
    crs = "+proj=tmerc +lat_0=0 +lon_0=-75.5 +k=0.9996 +x_0=500000 +y_0=0 +ellps=GRS80 +units=m"
    cog = write_image(tmp_path / "lc.tif", pixels(20, 30, seed=3)[:1], crs=crs)
    with rasterio.open(cog, "r+") as ds:
        ds.update_tags(**{TAG_CLASS_MAP: json.dumps(CLASS_MAP.to_json())})
    item = cog_item(str(cog))
    proj = ProjectionExtension.ext(item)
    assert proj.code is None
    assert proj.wkt2 is not None and "Transverse_Mercator" in proj.wkt2
    assert item.datetime is not None  # GeoTIFF inputs: the time of writing


def test_a_raster_that_is_not_a_prediction_gets_no_item(tmp_path: Path) -> None:
    cog = write_image(tmp_path / "x.tif", pixels(20, 30, seed=3)[:1])
    with pytest.raises(PredictionError, match=r"no LANDCOVER_CLASS_MAP tag"):
        cog_item(str(cog))


def _items_written(out: Path, tiled: bool) -> list[pystac.Item]:
    if not tiled:
        return [pystac.Item.from_file(str(out.with_suffix(".json")))]
    collection = pystac.Collection.from_file(str(out / "collection.json"))
    return list(collection.get_items())


@pytest.mark.parametrize("tiled", [False, True], ids=["one COG --stac-item", "tiled product"])
def test_every_item_of_a_prediction_is_dated_by_its_imagery_not_the_time_of_writing(
    model: Path, scene: Path, tmp_path: Path, tiled: bool
) -> None:
    catalog = write_catalog([raster_item(scene, item_id="scene-2021", year=2021)], tmp_path / "c")
    if tiled:
        out = tmp_path / "tiles"
        args = ["--out", f"{out}/", "--tile-size", "64", "--no-quicklook"]
    else:
        out = tmp_path / "lc.tif"
        args = ["--out", str(out), "--stac-item", str(tmp_path / "lc.json"), "--no-quicklook"]
    result = predict(model, str(catalog), *args)
    assert result.exit_code == 0, result.output
    items = _items_written(out, tiled)
    assert len(items) == (4 if tiled else 1)
    for item in items:
        assert item.datetime is None
        assert item.common_metadata.start_datetime == when(2021)
        assert item.common_metadata.end_datetime == when(2021)
        [derived] = item.get_links("derived_from")
        assert derived.href.endswith("scene-2021.json")
    if tiled:
        collection = pystac.Collection.from_file(str(out / "collection.json"))
        assert collection.extent.temporal.intervals == [[when(2021), when(2021)]]
