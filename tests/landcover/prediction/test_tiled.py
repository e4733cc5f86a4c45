"""The tiled map product (landcover.prediction.tiled, maptiles, tilerecords, tilecatalog):
its mosaic equals the one COG of the same region pixel for pixel; its STAC collection; ranks
(as threads) write the tiles one process writes; a rerun redoes only the missing tiles and
refuses another product's directory without --overwrite; az:// outputs.

The CLI (`--tile-size`, `--nproc 2`, `cluster launch`) is in tests/landcover/cli/test_tiled.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt
import pystac
import pytest
import rasterio
import shapely
from affine import Affine
from rasterio.crs import CRS
from rio_cogeo.cogeo import cog_validate

from landcover.errors import OutputExistsError
from landcover.prediction.config import PredictConfig
from landcover.prediction.maptiles import assign_tiles, map_tiles, tile_costs
from landcover.prediction.outgrid import OutputGrid
from landcover.prediction.region import parse_region
from landcover.prediction.runner import predict_region
from landcover.prediction.tiled import TiledResult, predict_product, predict_tiles
from landcover.prediction.tileplan import TiledSetup
from tests.azurite import Azurite
from tests.landcover.prediction.inputs import UTM18
from tests.support.prediction import config_for
from tests.support.stageruns import tile_pixels
from tiling.sources.stacdoc import check_item

TILE_PX = 64


@pytest.fixture(scope="module")
def triangle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GeoJSON triangle over the scene whose edges cut across tiles and blocks."""
    shape = shapely.Polygon(
        [(500_003.0, 3_999_990.0), (500_085.0, 3_999_930.0), (500_010.0, 3_999_928.0)]
    )
    path = tmp_path_factory.mktemp("region") / "tri.geojson"
    path.write_text(
        json.dumps(
            {
                "type": "Feature",
                "crs": {"type": "name", "properties": {"name": UTM18}},
                "properties": {},
                "geometry": shapely.geometry.mapping(shape),
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def product(
    scene: Path, random_model: Path, triangle: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, PredictConfig, TiledResult]:
    """The one COG (24 px blocks) and the tiled product (40 px blocks, 64 px tiles) of the
    triangle: the blocks of the two runs cut the windows differently."""
    folder = tmp_path_factory.mktemp("tiled")
    region = parse_region(str(triangle))
    one = config_for(random_model, scene, folder / "one.tif", region=region, block_px=24)
    predict_region(dataclasses.replace(one, batch_size=3))
    tiled = dataclasses.replace(one, out=f"{folder / 'tiles'}/", block_px=40, batch_size=3)
    result = predict_product(TiledSetup(tiled, TILE_PX))
    return folder / "one.tif", folder / "tiles", tiled, result


def read_all(path: Path) -> tuple[npt.NDArray[Any], dict[str, Any]]:
    with rasterio.open(path) as ds:
        return ds.read(), {
            "transform": ds.transform,
            "crs": ds.crs,
            "colormap": ds.colormap(1),
            "tags": ds.tags(),
            "nodata": ds.nodata,
        }


def test_the_mosaic_equals_the_one_cog_and_the_collection_lists_every_tile(
    product: tuple[Path, Path, PredictConfig, TiledResult],
) -> None:
    one, tiles, _, result = product
    expected, one_meta = read_all(one)
    mosaic, mosaic_meta = read_all(tiles / "mosaic.vrt")
    np.testing.assert_array_equal(mosaic, expected)
    assert len(np.unique(expected)) > 2  # nodata outside the triangle and several classes
    assert mosaic_meta == one_meta
    names = sorted(p.stem for p in tiles.glob("E*_N*.tif"))
    # 75 x 90 px from (500000, 4000000): the 64 px lattice cuts 2 x 2 tiles, each cut short
    # (the grid starts half a cell into its first column), all touched by the triangle.
    assert result.tiles == result.predicted == len(names) == 4
    for name in names:
        _, meta = read_all(tiles / f"{name}.tif")
        assert cog_validate(str(tiles / f"{name}.tif"))[0]
        with rasterio.open(tiles / f"{name}.tif") as ds:
            assert ds.overviews(1) or max(ds.width, ds.height) <= 512
            left, top = ds.transform.c, ds.transform.f
        x, y = (int(v) for v in name[1:].split("_N"))
        assert left - x < TILE_PX and y - top < TILE_PX  # named by its lattice cell's corner
        assert (meta["colormap"], meta["tags"]) == (one_meta["colormap"], one_meta["tags"])
    collection = pystac.Collection.from_file(str(tiles / "collection.json"))
    items = list(collection.get_items())
    assert sorted(item.id for item in items) == names
    assert collection.extra_fields["landcover:model"]["architecture"] == "small_unet"
    classes = collection.extra_fields["item_assets"]["landcover"]["classification:classes"]
    assert [c["value"] for c in classes] == list(range(5))
    for item in items:
        check_item(item.to_dict(), item.id)  # the checks landcover's STAC reader makes
        asset = item.assets["landcover"]
        assert Path(asset.get_absolute_href() or "") == tiles / f"{item.id}.tif"
        assert asset.extra_fields["file:size"] == (tiles / f"{item.id}.tif").stat().st_size
        with rasterio.open(tiles / f"{item.id}.tif") as ds:
            assert item.properties["proj:shape"] == [ds.height, ds.width]
    raw = json.loads((tiles / "collection.json").read_text())
    assert all(not link["href"].startswith("/") for link in raw["links"])  # relative hrefs


def test_ranks_write_the_tiles_of_one_process(
    product: tuple[Path, Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    _, tiles, config, _ = product
    many = dataclasses.replace(config, out=f"{tmp_path / 'many'}/", block_px=24)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(predict_product, TiledSetup(many, TILE_PX), rank=r, world_size=2)
            for r in range(2)
        ]
        results = [f.result(timeout=300) for f in futures]
    assert tile_pixels(tmp_path / "many") == tile_pixels(tiles)
    # Each rank predicted tiles of its own; together every tile once.
    assert results[1].predicted > 0
    assert results[0].tiles == results[0].predicted + results[1].predicted


def test_a_rerun_redoes_only_missing_tiles_and_refuses_tiles_of_other_options(
    product: tuple[Path, Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    _, tiles, config, first = product
    copy = tmp_path / "tiles"
    shutil.copytree(tiles, copy)  # keeps the mtimes
    config = dataclasses.replace(config, out=f"{copy}/")
    before = {p.name: p.stat().st_mtime_ns for p in copy.glob("E*_N*.tif")}
    gone = sorted(before)[1]
    (copy / gone).unlink()
    again = predict_product(TiledSetup(config, TILE_PX))
    assert (again.tiles, again.predicted) == (first.tiles, 1)
    after = {p.name: p.stat().st_mtime_ns for p in copy.glob("E*_N*.tif")}
    assert [n for n in before if after[n] != before[n]] == [gone]
    assert tile_pixels(copy) == tile_pixels(tiles)
    # The unit of work: a tile asked for again is kept.
    assert [r.name for r in predict_tiles(TiledSetup(config, TILE_PX), [gone[:-4]])] == [gone[:-4]]
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("E*_N*.tif")} == after
    other = dataclasses.replace(config, overlap_px=4)
    with pytest.raises(OutputExistsError, match=r"holds another tiled product .* pass --overwrite"):
        predict_product(TiledSetup(other, TILE_PX))
    assert {p.name: p.stat().st_mtime_ns for p in copy.glob("E*_N*.tif")} == after
    # With --overwrite the tile is predicted again, under the new options' key.
    old_key = json.loads((copy / "records" / f"{gone[:-4]}.json").read_text())["key"]
    (record,) = predict_tiles(
        TiledSetup(dataclasses.replace(other, overwrite=True), TILE_PX), [gone[:-4]]
    )
    assert record.key != old_key
    assert (copy / gone).stat().st_mtime_ns != after[gone]


def test_the_lattice_cuts_the_grid_into_named_tiles_and_ranks_share_them_by_area() -> None:
    grid = OutputGrid(CRS.from_epsg(32618), Affine(0.5, 0, 1000.5, 0, -0.5, 2000.0), 77, 50)
    tiles = map_tiles(grid, 20)
    cover = np.zeros((grid.height, grid.width), dtype=int)
    for tile in tiles:
        cover[tile.row0 : tile.row0 + tile.height, tile.col0 : tile.col0 + tile.width] += 1
        for row0, col0, height, width in tile.blocks(7):
            assert tile.row0 <= row0 and row0 + height <= tile.row0 + tile.height
            assert tile.col0 <= col0 and col0 + width <= tile.col0 + tile.width
    assert (cover == 1).all()  # every pixel in exactly one tile
    assert len({t.name for t in tiles}) == len(tiles)
    # Cells of 20 px = 10 m from the CRS origin: 1000.5 lies in the cell from 1000.
    assert tiles[0].name == "E1000_N2000" and (tiles[0].col0, tiles[0].width) == (0, 19)
    assert tiles[1].name == "E1010_N2000"
    rng = np.random.default_rng(0)
    costs = [int(c) for c in rng.integers(0, 100, size=40)]
    for world_size in (1, 3, 7, 60):
        owned = assign_tiles(costs, world_size)
        assigned = sorted(i for rank in owned for i in rank)
        assert assigned == [i for i, c in enumerate(costs) if c > 0]
        loads = [sum(costs[i] for i in rank) for rank in owned]
        # Longest-processing-time: the busiest rank is within one tile of the mean.
        assert max(loads) <= sum(costs) / world_size + max(costs)


@pytest.mark.azurite
def test_a_product_on_az_holds_the_local_tiles(
    product: tuple[Path, Path, PredictConfig, TiledResult], tmp_path: Path, azurite: Azurite
) -> None:
    _, tiles, config, first = product
    prefix = f"tiled-{tmp_path.name}"
    remote = dataclasses.replace(
        config, out=azurite.url(f"{prefix}/"), storage_options=azurite.storage_options
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(predict_product, TiledSetup(remote, TILE_PX), rank=r, world_size=2)
            for r in range(2)
        ]
        [f.result(timeout=300) for f in futures]
    fs = fsspec.filesystem("az", **azurite.storage_options)
    fs.invalidate_cache()
    folder = f"{azurite.container}/{prefix}"
    got = tmp_path / "got"
    fs.get(f"{folder}/", str(got), recursive=True)
    assert tile_pixels(got) == tile_pixels(tiles)
    collection = pystac.Collection.from_file(str(got / "collection.json"))
    assert len(list(collection.get_items())) == first.tiles
    with rasterio.open(got / "mosaic.vrt") as ds:
        assert ds.read().tobytes() == read_all(tiles / "mosaic.vrt")[0].tobytes()
    again = predict_product(TiledSetup(remote, TILE_PX))
    assert again.predicted == 0  # every tile kept


def test_tile_costs_of_thousands_of_tiles_over_thousands_of_images_are_the_clipped_areas() -> None:
    """A state's coverage is one geometry with vertices from every image: the cost of each of
    ~8,000 tiles over 2,000 jittered footprints equals the area of coverage ∩ tile."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    footprints = [
        shapely.box(x, y, x + 61, y + 76).segmentize(4)
        for i in range(50)
        for j in range(40)
        for x, y in [(i * 60 + rng.uniform(-1, 1), j * 75 + rng.uniform(-1, 1))]
    ]
    area = shapely.unary_union(footprints).difference(shapely.box(1000, 1000, 1300, 1250))
    grid = OutputGrid(CRS.from_epsg(32618), Affine(1.0, 0, -5.0, 0, -1.0, 3010.0), 3020, 3020)
    tree = shapely.STRtree(footprints)
    plan = SimpleNamespace(
        grid=grid, area=area, sources_touching=lambda g: list(tree.query(g, "intersects"))
    )
    tiles = map_tiles(grid, 34)
    costs = tile_costs(plan, tiles)  # type: ignore[arg-type]
    assert len(tiles) > 7_000 and 0 < costs.count(0) < len(tiles)
    for i in rng.choice(len(tiles), 400, replace=False):
        t = tiles[i]
        outline = shapely.box(*grid.window_bounds(t.row0, t.col0, t.height, t.width))
        assert costs[i] == round(area.intersection(outline).area), t.name
