"""What a tiled product (landcover.prediction.tiled) reports, names and writes: the tiles it
kept from an earlier run at any rank count, its collection's id however its directory is
written, and no COG or item for a tile without a pixel with data."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio

from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.tiled import TiledResult, predict_product
from landcover.prediction.tileplan import TiledSetup
from tests.landcover.prediction.inputs import pixels, write_image

TILE_PX = 64  # 2 x 2 tiles over the scene


def run_ranks(config: PredictConfig, world_size: int) -> list[TiledResult]:
    setup = TiledSetup(config, TILE_PX)
    with ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [
            pool.submit(predict_product, setup, rank=r, world_size=world_size)
            for r in range(world_size)
        ]
        return [f.result(timeout=300) for f in futures]


@pytest.mark.parametrize("world_size", [1, 2])
def test_only_tiles_committed_before_the_run_count_as_kept(
    scene: Path, random_model: Path, tmp_path: Path, world_size: int
) -> None:
    config = PredictConfig(
        str(random_model), (str(scene),), f"{tmp_path / 'tiles'}/", device="cpu", block_px=64
    )
    first = run_ranks(config, world_size)[0]
    assert (first.tiles, first.kept) == (4, 0)  # other ranks' tiles are not "kept"
    sorted((tmp_path / "tiles").glob("E*_N*.tif"))[0].unlink()  # one tile to predict again
    again = run_ranks(dataclasses.replace(config, overwrite=False), world_size)[0]
    assert (again.tiles, again.kept) == (4, 3)


@pytest.mark.parametrize(
    ("cwd", "written"),
    [("product", "./"), ("product", "."), ("other", "../product/"), (".", "./product/")],
)
def test_the_collection_is_named_by_the_directory_the_out_leads_to(
    scene: Path,
    random_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cwd: str,
    written: str,
) -> None:
    product = tmp_path / "product"
    product.mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / cwd)
    config = PredictConfig(str(random_model), (str(scene),), written, device="cpu")
    predict_product(TiledSetup(config, TILE_PX))
    collection = json.loads((product / "collection.json").read_text())
    assert collection["id"] == "product"


def test_a_tile_without_a_pixel_with_data_gets_no_cog_and_no_item(
    random_model: Path, tmp_path: Path
) -> None:
    # The 64 px lattice puts tile E499968_N4000000 over the image's columns 0..32 and rows
    # 0..64: nodata (0 in every band) there, inside the image's footprint.
    data = pixels(75, 90, seed=1)
    data[:, :64, :32] = 0
    image = write_image(tmp_path / "holed.tif", data)
    empty = "E499968_N4000000"
    one = PredictConfig(str(random_model), (str(image),), str(tmp_path / "one.tif"), device="cpu")
    predict_region(one)
    tiled = dataclasses.replace(one, out=f"{tmp_path / 'tiles'}/")
    result = predict_product(TiledSetup(tiled, TILE_PX))
    assert result.tiles == 4  # the empty tile too is a unit of work, committed
    written = sorted(p.name for p in (tmp_path / "tiles").iterdir())
    assert f"{empty}.tif" not in written and f"{empty}.json" not in written
    assert len([n for n in written if n.endswith(".tif")]) == 3
    collection = pystac.Collection.from_file(str(tmp_path / "tiles" / "collection.json"))
    assert sorted(i.id for i in collection.get_items()) == sorted(
        n.removesuffix(".tif") for n in written if n.endswith(".tif")
    )
    with (
        rasterio.open(tmp_path / "one.tif") as a,
        rasterio.open(tmp_path / "tiles/mosaic.vrt") as b,
    ):
        expected = a.read()
        np.testing.assert_array_equal(b.read(), expected)
    assert (expected[0, :64, :32] == 0).all() and (expected > 0).any()
    again = predict_product(TiledSetup(tiled, TILE_PX))  # the empty tile is committed: kept
    assert (again.predicted, again.kept) == (0, result.tiles)
