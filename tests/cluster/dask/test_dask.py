"""The Dask engine's pieces that need no cluster: its cluster.json section, the registry's
capabilities, where the ranks go, and what a rank runs inside a worker process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.dask.engine import plan_dask
from cluster.dask.places import assign_ranks, rank_environment
from cluster.dask.rank import run_rank
from cluster.dask.section import DaskSpec
from cluster.engine import Job
from cluster.engines import ENGINES, engine_info
from cluster.errors import ClusterError, ClusterSpecError, LaunchError
from tiling.runtime.rankenv import WORKER_ADDRESS_ENV


def test_the_section_and_its_refusals() -> None:
    embedded = parse_cluster_spec({"engine": "dask", "targetNodeCount": 3})
    assert (
        isinstance(embedded.section, DaskSpec)
        and embedded.section.embedded
        and embedded.workers == 3
    )
    remote = parse_cluster_spec(
        {"engine": "dask", "targetNodeCount": 2, "dask": {"scheduler": "tcp://10.0.0.4:8786"}}
    )
    assert (
        isinstance(remote.section, DaskSpec) and remote.section.scheduler == "tcp://10.0.0.4:8786"
    )
    assert remote.vcpus_per_node is None  # the workers' machines are not this one
    bad = {
        "dask.scheduler: must be a scheduler address": {"scheduler": "10.0.0.4 8786"},
        "unknown field 'dask.schedular': did you mean 'scheduler'?": {"schedular": "x"},
        'drop "threadsPerWorker"': {"scheduler": "tcp://a:1", "threadsPerWorker": 2},
        'dask.connectTimeout: must be a duration such as "30s"': {"connectTimeout": "soon"},
    }
    for message, section in bad.items():
        with pytest.raises(ClusterSpecError, match=message.replace("(", r"\(")):
            parse_cluster_spec({"engine": "dask", "targetNodeCount": 1, "dask": section})


def test_the_registry_knows_each_engine_and_its_capabilities() -> None:
    assert set(ENGINES) == {"local", "azureml", "kubernetes", "slurm", "dask"}
    assert engine_info("dask").runs_tasks and not engine_info("dask").starts_ranks
    assert all(info.starts_ranks for name, info in ENGINES.items() if name != "dask")
    with pytest.raises(ClusterError, match="unknown engine 'ray'; use one of local, "):
        engine_info("ray")


def test_ranks_take_per_node_workers_on_each_host() -> None:
    hosts = {"tcp://b:1": "b", "tcp://a:2": "a", "tcp://a:1": "a", "tcp://c:9": "c"}
    places = assign_ranks(hosts, nodes=2, per_node=1, one_host=False)
    assert [(p.rank, p.worker, p.node_rank, p.local_world_size) for p in places] == [
        (0, "tcp://a:1", 0, 1),
        (1, "tcp://b:1", 1, 1),
    ]
    pairs = assign_ranks(hosts, nodes=1, per_node=2, one_host=False)
    assert [p.worker for p in pairs] == ["tcp://a:1", "tcp://a:2"]
    with pytest.raises(LaunchError, match=r"1 host\(s\) with 2 worker\(s\) or more .* 2 x 2"):
        assign_ranks(hosts, nodes=2, per_node=2, one_host=False)
    local = {f"tcp://127.0.0.1:{p}": "127.0.0.1" for p in (5, 6, 7)}
    one = assign_ranks(local, nodes=3, per_node=1, one_host=True)
    assert [(p.local_rank, p.local_world_size, p.node_rank) for p in one] == [
        (0, 3, 0),
        (1, 3, 0),
        (2, 3, 0),
    ]
    env = rank_environment(one[2], world=3, master=("127.0.0.1", 2950))
    assert env["RANK"] == "2" and env["LOCAL_WORLD_SIZE"] == "3" and env["MASTER_PORT"] == "2950"
    assert env[WORKER_ADDRESS_ENV] == "tcp://127.0.0.1:7"


def test_the_plan_names_the_cluster_and_hides_secrets(tmp_path: Path) -> None:
    spec = parse_cluster_spec({"engine": "dask", "targetNodeCount": 2})
    job = Job(
        "landcover.training",
        ("store", "--out", str(tmp_path / "run")),
        outputs={"run": str(tmp_path / "run")},
        secret_env={"LANDCOVER_STORAGE_OPTIONS": '{"account_key": "s3cr3t-key"}'},
    )
    plan = plan_dask(spec, job)
    text = plan.describe()
    assert "a LocalCluster on this machine: 2 worker processes x 1 thread" in text
    assert f"logs: {tmp_path / 'run' / 'logs'}/rank-<i>.log" in text
    assert "s3cr3t-key" not in text and "LANDCOVER_STORAGE_OPTIONS=" in text
    assert plan.files() == {}


def test_a_rank_runs_its_module_in_this_process_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    module = tmp_path / "rank_probe.py"
    module.write_text(
        "import os, sys, logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "logging.getLogger('probe').info('rank %s argv %s', os.environ['RANK'], sys.argv[1:])\n"
        "sys.exit(3 if sys.argv[1:] == ['fail'] else 0)\n"
    )
    sys.path.insert(0, str(tmp_path))
    before = dict(os.environ)
    try:
        log = tmp_path / "logs" / "rank-1.log"
        assert run_rank("rank_probe", ["ok"], {"RANK": "1"}, str(log)) == 0
        assert run_rank("rank_probe", ["fail"], {"RANK": "1"}, str(log)) == 3
    finally:
        sys.path.remove(str(tmp_path))
    assert dict(os.environ) == before
    assert log.read_text().splitlines() == [
        "INFO:probe:rank 1 argv ['ok']",
        "INFO:probe:rank 1 argv ['fail']",
    ]
