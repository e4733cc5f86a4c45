"""Ranks on Dask workers: a rank whose worker dies is the cause the launch reports, in one
line naming the rank and its worker, not the collective error it left the other ranks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import distributed
import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.dask.engine import plan_dask, run_ranks
from cluster.engine import Job
from cluster.errors import LaunchError


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two worker processes (a rank's worker is killed: it must be a process of its own)."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as connected,
    ):
        yield connected


def test_a_killed_ranks_worker_is_the_one_line_cause(client: Any, tmp_path: Path) -> None:
    """Before: rank 0's gloo error ("internal error: RuntimeError: [../gloo/...] Connection
    closed by peer") was reported, and rank 1 was not named."""
    spec = parse_cluster_spec({"engine": "dask", "targetNodeCount": 1, "processesPerNode": 2})
    job = Job(
        "tests.cluster.dask.killed_rank",
        (),
        outputs={"run": str(tmp_path / "run")},
        process_group=True,
    )
    plan = plan_dask(spec, job, client=client)
    with pytest.raises(LaunchError) as failed:
        run_ranks(client, plan)
    message = str(failed.value)
    assert message.startswith("dask job failed: rank 1 (worker tcp://"), message
    assert ") died: killed by signal 9 (logs: " in message, message
    assert "\n" not in message and "gloo" not in message
