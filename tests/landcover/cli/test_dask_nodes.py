"""The Dask engine against a real `dask scheduler` and one `dask worker` on each of two
emulated nodes (network namespaces, `tests.cluster.dasknodes`): DDP with its ranks on
different nodes, then predict with the model it trained (a tiled product's tiles as tasks, one
COG as a rank per node), and a worker killed mid-tile whose sources are redone elsewhere."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import distributed
import pytest
import rasterio

from cluster.local.netns import network_unavailable_reason
from tests.cluster.dasknodes import DaskNodes, dask_nodes
from tests.landcover.prediction.inputs import pixels, write_image
from tests.support.chipstores import snapshot
from tests.support.stageruns import run, tile_args, tile_pixels

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        network_unavailable_reason() is not None, reason=str(network_unavailable_reason())
    ),
]

# Node 1's worker process dies (SIGKILL) right after staging its first part, once.
KILL_AFTER_FIRST_PART = """
import os
from pathlib import Path
from tiling.tiler.staging import PartStaging

_put = PartStaging.put

def put_then_die(self, part):
    _put(self, part)
    marker = Path(os.environ["LANDCOVER_TEST_KILLED"])
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), 9)

PartStaging.put = put_then_die
"""


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaskNodes, Path]]:
    folder = tmp_path_factory.mktemp("dask-nodes")
    hook = folder / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AFTER_FIRST_PART)
    marker = folder / "killed"
    repo = Path(__file__).resolve().parents[3]
    env = {1: {"PYTHONPATH": f"{hook}:{repo}", "LANDCOVER_TEST_KILLED": str(marker)}}
    with dask_nodes(folder / "logs", worker_env=env) as started:
        spec = {
            "engine": "dask",
            "targetNodeCount": 2,
            "processesPerNode": 1,
            "dask": {"scheduler": started.scheduler},
        }
        (folder / "dask.json").write_text(json.dumps(spec))
        yield started, folder


def wait_for_two_workers(scheduler: str) -> None:
    with distributed.Client(scheduler, timeout="60s") as client:
        client.wait_for_workers(2, timeout=120)


def test_a_worker_killed_mid_tile_leaves_the_store_of_one_process(
    nodes: tuple[DaskNodes, Path],
    images: Path,
    one_store: Path,
    tmp_path: Path,
) -> None:
    _, folder = nodes
    out = tmp_path / "killed.zarr"
    result = run("cluster", "launch", str(folder / "dask.json"), "--", *tile_args(images, out))
    assert result.exit_code == 0, result.output
    assert (folder / "killed").exists()  # node 1's worker did die mid-tile
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})


def test_ddp_ranks_on_two_nodes_then_predict_there(
    nodes: tuple[DaskNodes, Path], tiny_store: str, tmp_path: Path
) -> None:
    started, folder = nodes
    wait_for_two_workers(started.scheduler)  # node 1's worker may still be restarting
    run_dir = tmp_path / "run"
    start = time.monotonic()
    result = run(
        "cluster", "launch", str(folder / "dask.json"), "--", "train", tiny_store, "--out",
        str(run_dir), "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--no-augment",
    )  # fmt: skip
    assert result.exit_code == 0, f"{result.output} ({time.monotonic() - start:.0f} s)"
    ranks = json.loads((run_dir / "run.json").read_text())["ranks"]
    hosts = [r["worker"].removeprefix("tcp://").rsplit(":", 1)[0] for r in ranks]
    assert sorted(hosts) == sorted(started.layout.addresses)  # one rank on each node
    (line,) = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["world_size"] == 2
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "on the route to the master" in log  # gloo talks on the node's own interface
    # predict with that model: a tiled product's tiles as tasks, and one COG as a rank per node
    scene = write_image(tmp_path / "scene.tif", pixels(75, 90, seed=1))
    args = ["predict", str(run_dir / "model.pt"), str(scene), "--block-px", "40",
            "--batch-size", "3", "--device", "cpu", "--no-quicklook"]  # fmt: skip
    for out in (f"{tmp_path}/one/", f"{tmp_path}/one.tif"):
        extra = ("--tile-size", "32") if out.endswith("/") else ()
        here = run(*args, *extra, "--out", out)
        assert here.exit_code == 0, here.output
        there = run("cluster", "launch", str(folder / "dask.json"), "--", *args, *extra,
                    "--out", out.replace("one", "nodes"))  # fmt: skip
        assert there.exit_code == 0, there.output
    assert tile_pixels(tmp_path / "nodes") == tile_pixels(tmp_path / "one")
    assert len(tile_pixels(tmp_path / "one")) > 4
    with rasterio.open(tmp_path / "one.tif") as one, rasterio.open(tmp_path / "nodes.tif") as two:
        assert (one.read() == two.read()).all()
