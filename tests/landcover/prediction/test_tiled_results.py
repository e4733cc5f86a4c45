"""What a tiled product (landcover.prediction.tiled) reports and names: the tiles it kept
from an earlier run at any rank count, and its collection's id however its directory is
written."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from landcover.prediction.config import PredictConfig
from landcover.prediction.tiled import TiledResult, predict_product
from landcover.prediction.tileplan import TiledSetup
from tests.landcover.prediction.inputs import write_model

TILE_PX = 64  # 2 x 2 tiles over the scene


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "random.pt", seed=7)


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
