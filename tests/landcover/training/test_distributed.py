"""The launcher environment (read in one place) and the trainer's collectives."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from landcover.errors import TrainingError
from landcover.training.distributed import (
    Collectives,
    DistEnv,
    check_shard_fits,
    process_group,
    read_dist_env,
)
from tests.multiprocess import free_port

TORCHRUN_ENV = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.4",
    "MASTER_PORT": "29500",
}


def test_no_launcher_is_a_world_of_one() -> None:
    env = read_dist_env({})
    assert env == DistEnv()
    assert not env.is_distributed and env.is_main and env.nodes == 1


def test_torchrun_environment() -> None:
    env = read_dist_env(TORCHRUN_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.node_rank, env.nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.4", 29500)
    assert env.is_distributed and not env.is_main


def test_node_rank_is_preferred_to_group_rank() -> None:
    assert read_dist_env({**TORCHRUN_ENV, "NODE_RANK": "3", "GROUP_RANK": "1"}).node_rank == 3


def test_node_rank_defaults_from_rank() -> None:
    env = {k: v for k, v in TORCHRUN_ENV.items() if k != "GROUP_RANK"}
    assert read_dist_env(env).node_rank == 5 // 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "8"}, "RANK=8 must be < WORLD_SIZE=8"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 must be < LOCAL_WORLD_SIZE=4"),
        ({"RANK": "-1"}, "RANK=-1 must be >= 0"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR/MASTER_PORT are not set"),
    ],
)
def test_bad_launcher_values_are_named(override: dict[str, str], message: str) -> None:
    with pytest.raises(TrainingError, match=message):
        read_dist_env({**TORCHRUN_ENV, **override})


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
