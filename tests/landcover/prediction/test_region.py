"""Regions: GeoJSON (Feature, FeatureCollection, geometry), bbox and WKT, in any CRS."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyproj
import pytest
import shapely
from click.testing import CliRunner
from rasterio.crs import CRS

from landcover.cli.app import main
from landcover.errors import RegionError
from landcover.prediction.region import parse_bbox, parse_crs, parse_region, region_from_geojson
from tests.landcover.prediction.inputs import write_model

SQUARE = {"type": "Polygon", "coordinates": [[[0, 0], [2, 0], [2, 2], [0, 2], [0, 0]]]}
OTHER = {"type": "Polygon", "coordinates": [[[5, 5], [6, 5], [6, 6], [5, 6], [5, 5]]]}


def write(tmp_path: Path, obj: object, name: str = "r.geojson") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_geojson_geometry_feature_and_collection(tmp_path: Path) -> None:
    geometry = parse_region(write(tmp_path, SQUARE))
    assert geometry.geometry.area == 4 and geometry.crs == CRS.from_epsg(4326)
    feature = parse_region(
        write(tmp_path, {"type": "Feature", "properties": {}, "geometry": SQUARE})
    )
    assert feature.geometry.equals(geometry.geometry)
    collection = region_from_geojson(
        {
            "type": "FeatureCollection",
            "features": [
                {"type": "Feature", "properties": {}, "geometry": SQUARE},
                {"type": "Feature", "properties": {"id": 2}, "geometry": OTHER},
            ],
        }
    )
    assert collection.geometry.geom_type == "MultiPolygon"
    assert collection.geometry.area == 5


def test_region_crs_option_and_legacy_geojson_crs(tmp_path: Path) -> None:
    utm = parse_region(write(tmp_path, SQUARE), crs="EPSG:32618")
    assert utm.crs == CRS.from_epsg(32618)
    legacy = {
        "type": "FeatureCollection",
        "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::26916"}},
        "features": [{"type": "Feature", "properties": {}, "geometry": SQUARE}],
    }
    assert parse_region(write(tmp_path, legacy)).crs == CRS.from_epsg(26916)
    # An explicit --region-crs wins over the file's member.
    assert parse_region(write(tmp_path, legacy), crs="EPSG:3857").crs == CRS.from_epsg(3857)


def test_wkt_string_and_wkt_file(tmp_path: Path) -> None:
    text = "POLYGON ((0 0, 3 0, 3 1, 0 1, 0 0))"
    assert parse_region(text).geometry.area == 3
    path = tmp_path / "r.wkt"
    path.write_text(text + "\n")
    assert parse_region(path, crs="EPSG:32618").crs == CRS.from_epsg(32618)


def test_bbox() -> None:
    region = parse_bbox("-76.6, 38.9, -76.5, 39.0")
    assert region.bounds == pytest.approx((-76.6, 38.9, -76.5, 39.0))
    assert region.crs == CRS.from_epsg(4326)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,2,3", "must be four numbers W,S,E,N"),
        ("a,b,c,d", "must be four numbers W,S,E,N"),
        ("3,2,1,4", "must have W < E and S < N"),
        ("0,0,nan,1", "not a finite number"),
    ],
)
def test_bad_bbox(text: str, message: str) -> None:
    with pytest.raises(RegionError, match=message):
        parse_bbox(text)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"type": "Feature", ', "invalid GeoJSON \\(Expecting"),
        ("[1, 2]", "invalid GeoJSON: expected an object"),
        ('{"type": "Topology"}', "invalid GeoJSON: type 'Topology'"),
        ('{"type": "FeatureCollection", "features": []}', "FeatureCollection has no features"),
        ('{"type": "Feature", "geometry": null}', "a feature has no geometry"),
        ('{"type": "Polygon", "coordinates": [[1, 2]]}', "invalid GeoJSON geometry"),
        ('{"type": "Point", "coordinates": [1, 2]}', "region has no area \\(Point\\)"),
    ],
)
def test_invalid_geojson(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.geojson"
    path.write_text(body)
    with pytest.raises(RegionError, match=message) as info:
        parse_region(path)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


def test_missing_file_and_bad_wkt_and_bad_crs(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="no such file and not WKT"):
        parse_region(tmp_path / "nope.geojson")
    with pytest.raises(RegionError, match="invalid WKT"):
        parse_region("POLYGON ((0 0, 1 1")
    with pytest.raises(RegionError, match="--region-crs 'EPSG:99999999' is not a CRS"):
        parse_crs("EPSG:99999999")


def test_self_intersecting_polygon_is_repaired() -> None:
    bowtie = parse_region("POLYGON ((0 0, 2 2, 2 0, 0 2, 0 0))", crs="EPSG:32618")
    assert bowtie.geometry.is_valid
    assert bowtie.geometry.area == pytest.approx(2.0)


def test_reprojection_keeps_curved_edges() -> None:
    # A 1 x 1 degree box in UTM: its edges curve, so the densified outline matches the exact
    # transform of points along the edge far better than its 4 corners would.
    region = parse_bbox("-77,38,-76,39")
    utm = region.to_crs(CRS.from_epsg(32618))
    to_utm = pyproj.Transformer.from_crs("EPSG:4326", "EPSG:32618", always_xy=True)
    x, y = to_utm.transform(-76.5, 39.0)  # the middle of the top edge
    assert utm.geometry.exterior.distance(shapely.Point(x, y)) < 1.0  # metres
    corners_only = shapely.Polygon(
        [to_utm.transform(*c) for c in [(-77, 38), (-76, 38), (-76, 39), (-77, 39)]]
    )
    assert corners_only.exterior.distance(shapely.Point(x, y)) > 50.0
    back = utm.to_crs(CRS.from_epsg(4326))
    assert back.geometry.symmetric_difference(region.geometry).area < 1e-8


@pytest.mark.parametrize(
    "region_args",
    [
        ["--bbox", "500000,3999925,500090,4000000", "--region-crs", "EPSG:999999"],
        ["--region", "POLYGON ((0 0, 1 0, 1 1, 0 0))", "--region-crs", "EPSG:999999"],
        ["--region", "{legacy_crs}"],
    ],
)
def test_an_unknown_crs_is_our_one_line_without_gdal_s_own(
    scene: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    region_args: list[str],
) -> None:
    """GDAL/PROJ print "ERROR 1: PROJ: ... crs not found" (or log it, inside rasterio.Env)
    before our line unless silenced."""
    legacy = {**SQUARE, "crs": {"type": "name", "properties": {"name": "EPSG:999999"}}}
    args = [a.replace("{legacy_crs}", str(write(tmp_path, legacy))) for a in region_args]
    caplog.set_level(logging.INFO)
    model = write_model(tmp_path / "model.pt")
    result = CliRunner().invoke(
        main, ["predict", str(model), str(scene), "--out", str(tmp_path / "lc.tif"), *args]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --region-crs 'EPSG:999999' is not a CRS; use e.g. EPSG:4326 or EPSG:26916\n"
    )
    assert capfd.readouterr().err == ""
    assert [r.getMessage() for r in caplog.records if r.name.startswith("rasterio")] == []
    with pytest.raises(RegionError, match="--dst-crs 'EPSG:999999' is not a CRS"):
        parse_crs("EPSG:999999", what="--dst-crs")
    assert capfd.readouterr().err == ""
