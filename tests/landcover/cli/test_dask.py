"""`landcover cluster launch dask.json -- tile|train|predict` on a Dask LocalCluster of two
worker processes, shared by the module: each stage gives what one process gives.

The cluster.json names the LocalCluster's scheduler, so the launches connect to it as a
client (the embedded form, which starts its own LocalCluster, is the same code after the
client is made: `cluster.dask.client.dask_client`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import distributed
import pytest
import torch

import landcover
from tests.support.chipstores import snapshot
from tests.support.stageruns import cog_bytes, predict_args, run, tile_args, tile_pixels
from tiling.staged import staging_url


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[Any]:
    """A LocalCluster of 2 single-threaded worker processes, for the whole module."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(local_cluster: Any) -> Iterator[Any]:
    with distributed.Client(local_cluster) as connected:
        yield connected


@pytest.fixture(scope="module")
def dask_json(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster.json naming the LocalCluster's scheduler."""
    path = tmp_path_factory.mktemp("dask") / "dask.json"
    spec = {
        "engine": "dask",
        "targetNodeCount": 1,
        "processesPerNode": 2,
        "dask": {"scheduler": local_cluster.scheduler_address},
    }
    path.write_text(json.dumps(spec))
    yield path


def test_plan_says_what_runs_where(dask_json: Path, images: Path, tmp_path: Path) -> None:
    tile = run("cluster", "plan", str(dask_json), "--", *tile_args(images, tmp_path / "s.zarr"))
    assert tile.exit_code == 0, tile.output
    assert "engine: dask" in tile.output and "tasks: one per source, 2 retries" in tile.output
    train = run("cluster", "plan", str(dask_json), "--", "train", "s.zarr", "--out", "run")
    assert train.exit_code == 0, train.output
    assert "ranks: 2 (2 worker(s) on each of 1 worker host(s))" in train.output
    assert "MASTER_ADDR = rank 0's worker host" in train.output


def test_tile_as_tasks_writes_the_bytes_of_one_process(
    dask_json: Path,
    images: Path,
    one_store: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "tasks.zarr"
    result = run("cluster", "launch", str(dask_json), "--", *tile_args(images, out))
    assert result.exit_code == 0, result.output
    assert "done: dask tasks" in result.output
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})
    assert not Path(staging_url(str(out))).exists()  # the parts went into the store


def test_predict_on_the_workers_writes_the_bytes_of_one_process(
    dask_json: Path,
    predict_inputs: tuple[Path, Path, Path],
    one_prediction: tuple[Path, str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "lc.tif"
    result = run("cluster", "launch", str(dask_json), "--", *predict_args(predict_inputs, out))
    assert result.exit_code == 0, result.output
    assert cog_bytes(out) == cog_bytes(one_prediction[0])


def test_the_python_api_tiles_and_predicts_on_a_client(
    client: Any,
    images: Path,
    predict_inputs: tuple[Path, Path, Path],
    one_prediction: tuple[Path, str],
    tmp_path: Path,
) -> None:
    options: dict[str, Any] = {"chip_size": 64, "shard_size": 3, "workers": 1}
    labels = [str(images.parent / "nlcd" / "*.tif")]
    tiles = str(images / "*.tif")
    here = landcover.tile(tiles, tmp_path / "here.zarr", labels=labels, class_map="nlcd", **options)
    there = landcover.tile(
        tiles, tmp_path / "there.zarr", labels=labels, class_map="nlcd", cluster=client, **options
    )
    assert there.summary.num_chips == here.summary.num_chips > 0
    assert snapshot(str(tmp_path / "there.zarr"), {}) == snapshot(str(tmp_path / "here.zarr"), {})
    scene, model, region = predict_inputs
    out = tmp_path / "lc.tif"
    probabilities = str(out.with_suffix(".p.tif"))
    result = landcover.predict(
        model, scene, out, region=region, cluster=client, probabilities=probabilities,
        block_px=16, batch_size=3, device="cpu",
    )  # fmt: skip
    assert result.out == str(out)
    assert cog_bytes(out) == cog_bytes(one_prediction[0])


def test_a_bad_argument_is_refused_before_the_cluster_is_asked(
    dask_json: Path, images: Path, tmp_path: Path
) -> None:
    result = run(
        "cluster", "launch", str(dask_json), "--", *tile_args(images, tmp_path / "s.zarr"),
        "--chip-size", "0",
    )  # fmt: skip
    assert result.exit_code == 2 and "--chip-size" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_ddp_on_the_workers_equals_torchrun_and_records_the_workers(
    client: Any, tiny_store: str, tmp_path: Path
) -> None:
    """`landcover.train(cluster=client)`: world size 2, one rank per worker, the same weights
    as `train --nproc 2` (torchrun), every rank's worker in run.json and its log in the run
    dir, and the TrainResult read back from it."""
    common = ["--batch-size", "8", "--device", "cpu", "--no-augment"]
    dask_run, torchrun = tmp_path / "dask", tmp_path / "torchrun"
    result = landcover.train(
        tiny_store, dask_run, cluster=client, epochs=1, batch_size=8, device="cpu", augment=False
    )
    assert result.run_dir == dask_run and result.epochs_completed == 1
    assert result.metrics[0].world_size == 2
    reference = run("train", tiny_store, "--out", str(torchrun), "--nproc", "2", "--epochs", "1",
                    *common)  # fmt: skip
    assert reference.exit_code == 0, reference.output
    ours = torch.load(dask_run / "model.pt", weights_only=True)["state_dict"]
    theirs = torch.load(torchrun / "model.pt", weights_only=True)["state_dict"]
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ranks = json.loads((dask_run / "run.json").read_text())["ranks"]
    workers = [r["worker"] for r in ranks]
    assert [r["rank"] for r in ranks] == [0, 1] and len(set(workers)) == 2
    assert all(w.startswith("tcp://") for w in workers)
    assert sorted(p.name for p in (dask_run / "logs").glob("rank-*.log")) == [
        "rank-0.log",
        "rank-1.log",
    ]
    (line,) = (dask_run / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["world_size"] == 2


def test_a_failing_rank_is_one_line(dask_json: Path, tmp_path: Path) -> None:
    """A rank that refuses its input ends the job with that rank's own line (what one process
    prints), no traceback."""
    missing = tmp_path / "absent.zarr"
    result = run(
        "cluster", "launch", str(dask_json), "--", "train", str(missing), "--out",
        str(tmp_path / "run"), "--epochs", "1",
    )  # fmt: skip
    assert result.exit_code != 0
    last = result.output.strip().splitlines()[-1]
    fix = f"create one with `landcover tile IMAGES --out {missing}`"
    assert last == f"error: {missing}: no chip store there; {fix}", result.output
    assert "Traceback" not in result.output


def test_a_tiled_predict_runs_a_task_per_tile_and_writes_the_tiles_of_one_process(
    dask_json: Path, client: Any, tmp_path: Path
) -> None:
    from tests.landcover.prediction.inputs import pixels, write_image, write_model

    scene = write_image(tmp_path / "scene.tif", pixels(75, 90, seed=1))
    model = write_model(tmp_path / "model.pt", seed=7)
    args = [
        "predict", str(model), str(scene), "--block-px", "40", "--batch-size", "3",
        "--device", "cpu", "--tile-size", "32", "--no-quicklook",
    ]  # fmt: skip
    plan = run("cluster", "plan", str(dask_json), "--", *args, "--out", f"{tmp_path}/p/")
    assert plan.exit_code == 0, plan.output
    assert "tasks: one per tile, 2 retries" in plan.output
    one = run(*args, "--out", f"{tmp_path}/one/")
    assert one.exit_code == 0, one.output
    tasks = run("cluster", "launch", str(dask_json), "--", *args, "--out", f"{tmp_path}/tasks/")
    assert tasks.exit_code == 0, tasks.output
    assert "done: dask tasks" in tasks.output
    expected = tile_pixels(tmp_path / "one")
    assert len(expected) > 4
    assert tile_pixels(tmp_path / "tasks") == expected
    catalog = json.loads((tmp_path / "tasks" / "collection.json").read_text())
    assert len([link for link in catalog["links"] if link["rel"] == "item"]) == len(expected)
    assert (tmp_path / "tasks" / "mosaic.vrt").is_file()
    api = landcover.predict(
        model, scene, tmp_path / "api", tile_px=32, cluster=client, block_px=40, batch_size=3,
        device="cpu",
    )  # fmt: skip
    assert api.tiles == len(expected) and api.predicted == len(expected)
    assert tile_pixels(tmp_path / "api") == expected
