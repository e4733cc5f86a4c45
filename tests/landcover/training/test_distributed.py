"""The trainer's collectives and its share of the node (the launcher environment: test_distenv)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from landcover.distenv import DistEnv
from landcover.errors import TrainingError
from landcover.training.distributed import (
    Collectives,
    check_shard_fits,
    process_group,
)
from tests.multiprocess import free_port


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
