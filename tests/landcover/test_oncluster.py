"""A new task engine is its own sub-package plus one registry row: `tests.cluster.fake_task_engine`
(tasks on threads, ranks on threads, a training job's ranks as processes of this machine),
registered by a fixture, runs `tile`, `train` and `predict` through the Python API's
`cluster=` with no edit of `landcover`, and each stage gives what one process gives.

Which stages a task engine runs, and how (as the Dask engine does): `tile` as one task per
source (`TaskEngine.runner`); `train` as ranks that form a process group, one a worker
(`TaskEngine.plan`, launched by the row's `Engine`); a one-COG `predict` as one rank per
worker (`TaskEngine.run_ranks`); a tiled `predict` as one task per tile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rasterio

import landcover
from cluster.engines import ENGINES
from landcover.errors import LandcoverError
from landcover.prediction.runner import PredictResult
from landcover.prediction.tiled import TiledResult
from tests.cluster.fake_task_engine import NAME, ROW, FakeCluster
from tests.landcover.conftest import TINY_CHIP_PX
from tests.support.chipstores import snapshot
from tests.support.stageruns import tile_pixels
from tiling.synthetic.scenes import SynthResult


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    """The fake engine's registry row added for the test, and a cluster of 2 workers."""
    monkeypatch.setitem(ENGINES, NAME, ROW)
    yield FakeCluster(workers=2)


@pytest.mark.slow  # tile, two training ranks and predict through the fake engine
def test_a_fake_task_engine_runs_tile_train_and_predict(
    fake_cluster: FakeCluster, tiny_scenes: SynthResult, tiny_store: str, tmp_path: Path
) -> None:
    images = [str(p) for p in tiny_scenes.image_paths]
    labels = [str(p) for p in tiny_scenes.label_paths]
    store = tmp_path / "tasks.zarr"
    landcover.tile(
        images, store, labels=labels, cluster=fake_cluster, chip_size=TINY_CHIP_PX,
        shard_size=16, val_fraction=0.25, workers=1,
    )  # fmt: skip
    assert fake_cluster.ran == [f"tasks: {len(images)} sources"]
    assert snapshot(str(store), {}) == snapshot(tiny_store, {})  # as tiny_store's one process

    run = landcover.train(
        store, tmp_path / "run", cluster=fake_cluster, epochs=1, batch_size=8, threads=1, seed=3
    )
    assert fake_cluster.ran[-1] == "job: 2 x landcover.training"
    assert run.epochs_completed == 1
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["world_size"] == 2

    model = run.run_dir / "model.pt"
    options: dict[str, Any] = {"block_px": 40, "batch_size": 3, "device": "cpu"}
    landcover.predict(model, images[0], tmp_path / "one.tif", **options)
    ranks = landcover.predict(
        model, images[0], tmp_path / "ranks.tif", cluster=fake_cluster, **options
    )
    assert fake_cluster.ran[-1] == "ranks: 2"
    assert isinstance(ranks, PredictResult) and ranks.valid_pixels > 0
    with rasterio.open(tmp_path / "one.tif") as one, rasterio.open(tmp_path / "ranks.tif") as two:
        assert one.profile == two.profile
        assert one.read().tobytes() == two.read().tobytes()

    whole_tiles: dict[str, Any] = {"batch_size": 3, "device": "cpu"}  # a tile in one block
    landcover.predict(model, images[0], tmp_path / "one", tile_px=160, **whole_tiles)
    tiled = landcover.predict(
        model, images[0], tmp_path / "tiles", tile_px=160, cluster=fake_cluster, **whole_tiles
    )
    expected = tile_pixels(tmp_path / "one")
    assert len(expected) > 1 and tile_pixels(tmp_path / "tiles") == expected
    assert fake_cluster.ran[-1] == f"tasks: {len(expected)} tile"
    assert isinstance(tiled, TiledResult) and tiled.tiles == len(expected)


def test_without_its_registry_row_the_engine_is_unknown(tmp_path: Path) -> None:
    """The fake is found only through the registry: without its row, its cluster object is
    no cluster."""
    assert NAME not in ENGINES
    with pytest.raises(LandcoverError) as raised:
        landcover.tile("a.tif", tmp_path / "s.zarr", cluster=FakeCluster())
    assert str(raised.value) == (
        "cluster= takes a cluster.json path or a distributed.Client, got FakeCluster"
    )
