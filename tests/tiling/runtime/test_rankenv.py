"""The rank-environment contract: what a launcher writes for a rank is what the rank reads."""

from __future__ import annotations

import pytest

from tiling.runtime.rankenv import (
    WORKER_ADDRESS_ENV,
    DistEnv,
    RankEnvError,
    rank_environment,
    read_rank_env,
)


def test_what_a_launcher_writes_is_what_the_rank_reads() -> None:
    place = DistEnv(5, 8, 1, 4, 1, "10.0.0.4", 29500, worker_address="tcp://10.0.0.5:4000")
    environ = rank_environment(place)
    assert environ[WORKER_ADDRESS_ENV] == "tcp://10.0.0.5:4000"
    assert read_rank_env(environ) == place


def test_no_variables_are_a_world_of_one_and_bad_ones_are_named() -> None:
    assert read_rank_env({}) == DistEnv()
    with pytest.raises(RankEnvError, match=r"^WORLD_SIZE='two' is not an integer; fix"):
        read_rank_env({"WORLD_SIZE": "two"})
