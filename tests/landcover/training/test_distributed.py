"""The trainer's collectives and its share of the node (the launcher environment: test_distenv)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from cluster.local.netns import NODE_INTERFACE, NodeNetwork, plan_network
from landcover.distenv import SocketChoice
from landcover.errors import TrainingError
from landcover.training import distributed
from landcover.training.distributed import (
    Collectives,
    check_shard_fits,
    process_group,
)
from tests.conftest import REPO_ROOT
from tests.multiprocess import free_port
from tiling.runtime.rankenv import DistEnv


def test_shard_too_big_names_the_worker_count_that_fits() -> None:
    gib = 1024**3

    def need(workers: int) -> int:  # a 100 GiB store
        return -(-100 * gib // workers)

    assert check_shard_fits(need, world_size=10, local_world_size=2, available_bytes=40 * gib)
    with pytest.raises(TrainingError) as info:
        check_shard_fits(need, world_size=4, local_world_size=2, available_bytes=40 * gib)
    # 40 GiB x 0.7 / 2 local workers = 14 GiB per worker: 100 / 14 -> 8 workers.
    assert str(info.value) == (
        "each worker's shard needs 25.00 GiB with 4 workers but only 14.00 GiB is free per "
        "worker (40.00 GiB available x 0.7 / 2 workers on this node); use at least 8 workers "
        "in total (spread over more nodes) or machines with more memory"
    )


def test_collectives_of_a_world_of_one_are_identities() -> None:
    comms = Collectives(DistEnv(), torch.device("cpu"))
    assert comms.broadcast_object({"a": 1}) == {"a": 1}
    assert comms.gather_objects(3) == [3]
    assert comms.gather_to_main(3) == [3]
    assert comms.scatter_from_main([7]) == 7
    assert comms.max_floats([1.5, 2.0]) == [1.5, 2.0]
    assert comms.sum_(torch.ones(2)).tolist() == [1.0, 1.0]
    comms.raise_if_any(None)
    with pytest.raises(TrainingError, match="shard too big"):
        comms.raise_if_any("shard too big")


def _collectives_worker(rank: int, port: int) -> None:
    env = DistEnv(
        rank=rank, world_size=2, local_world_size=2, local_rank=rank,
        master_addr="127.0.0.1", master_port=port,
    )  # fmt: skip
    with process_group(env, torch.device("cpu")) as comms:
        assert comms.sum_floats([rank + 1.0]) == [3.0]
        assert comms.max_floats([float(rank), -float(rank)]) == [1.0, 0.0]
        assert comms.broadcast_object(f"from {rank}") == "from 0"
        assert comms.gather_objects(rank * 10) == [0, 10]
        gathered = comms.gather_to_main({"rank": rank})
        assert gathered == ([{"rank": 0}, {"rank": 1}] if rank == 0 else None)
        assert comms.scatter_from_main(["a", "b"] if rank == 0 else None) == "ab"[rank]
        module = nn.BatchNorm1d(3)
        running_mean = module.running_mean
        assert running_mean is not None
        with torch.no_grad():
            module.weight.fill_(rank + 2.0)
            running_mean.fill_(rank + 5.0)
        comms.broadcast_module(module, buffers_only=True)
        assert running_mean.tolist() == [5.0] * 3  # rank 0's buffers
        assert module.weight.tolist() == [rank + 2.0] * 3  # parameters untouched
        comms.broadcast_module(module)
        assert module.weight.tolist() == [2.0] * 3
        # One rank's problem stops every rank with the same message.
        with pytest.raises(TrainingError, match="rank 1 is out of memory"):
            comms.raise_if_any("rank 1 is out of memory" if rank == 1 else None)


@pytest.mark.slow
def test_two_process_gloo_collectives() -> None:
    mp.spawn(_collectives_worker, args=(free_port(),), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]


def _rank_of_two_nodes(rank: int, master: str, port: int) -> DistEnv:
    return DistEnv(
        rank=rank, world_size=2, local_rank=0, local_world_size=1, node_rank=rank,
        master_addr=master, master_port=port,
    )  # fmt: skip


def test_a_rank_that_cannot_connect_is_one_line_naming_master_interface_and_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the issue's report: "internal error: RuntimeError: Gloo connectFullMesh failed ...
    # remote=[127.0.0.1]" on a node whose host name resolves to loopback
    chosen = SocketChoice("GLOO_SOCKET_IFNAME", "eth9", "10.0.0.5", chosen=True)
    monkeypatch.setattr(distributed, "choose_socket_interface", lambda env, backend: chosen)
    seen: dict[str, str | None] = {}

    def refused(**kwargs: object) -> None:
        seen["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME")
        raise RuntimeError(
            "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:"
            "144] no error\nmore"
        )

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # restored after the test
    monkeypatch.setattr("torch.distributed.init_process_group", refused)
    with (
        pytest.raises(TrainingError) as info,
        process_group(_rank_of_two_nodes(1, "10.0.0.4", 29500), torch.device("cpu")),
    ):
        pass
    assert seen == {"GLOO_SOCKET_IFNAME": "eth9"}  # set before the group forms
    assert str(info.value) == (
        "rank 1 of 2 could not connect to the other ranks (master 10.0.0.4:29500, interface "
        "eth9 (10.0.0.5, on the route to the master)): Gloo connectFullMesh failed with "
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error; set GLOO_SOCKET_IFNAME "
        'to the interface on which the nodes reach each other (on slurm "socketInterface" in '
        "cluster.json), and check that the master port is open between the nodes"
    )


_RANK_ON_A_NODE = """
import os, sys, torch
from tiling.runtime.rankenv import DistEnv
from landcover.training.distributed import process_group
rank, master, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
env = DistEnv(rank=rank, world_size=2, local_rank=0, local_world_size=1, node_rank=rank,
              master_addr=master, master_port=port)
with process_group(env, torch.device("cpu")) as comms:
    total = comms.sum_floats([rank + 1.0])[0]
    print(total, os.environ.get("GLOO_SOCKET_IFNAME"), flush=True)
"""


@pytest.mark.slow  # two processes import torch: about 10 s
@pytest.mark.usefixtures("require_emulated_nodes")
def test_two_nodes_whose_host_name_is_loopback_form_a_gloo_group() -> None:
    # each emulated node is a namespace in which the host name resolves to 127.0.0.1, and
    # nobody set GLOO_SOCKET_IFNAME: gloo alone would offer 127.0.0.1 to the other node
    env = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    with NodeNetwork(plan_network(2)) as net:
        layout = net.layout
        master, port = layout.addresses[0], "29533"
        command = [sys.executable, "-c", _RANK_ON_A_NODE]
        ranks = [
            subprocess.Popen(
                [*layout.enter(rank), *command, str(rank), master, port],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for rank in (0, 1)
        ]
        try:
            outputs = [rank.communicate(timeout=120) for rank in ranks]
        finally:
            for rank in ranks:
                rank.kill()
    for rank, (out, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-2000:]
        assert out.split() == ["3.0", NODE_INTERFACE]  # the interface on the route
