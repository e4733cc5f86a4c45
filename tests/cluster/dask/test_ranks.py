"""Ranks on Dask workers: a rank whose worker dies is the cause the launch reports, in one
line naming the rank and its worker, not the collective error it left the other ranks; a
refused input is the rank's own line; temporary logs stay only after a crash."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import distributed
import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.dask.client import TaskRunner
from cluster.dask.engine import DaskEngine, plan_dask, run_ranks
from cluster.engine import Job, LaunchOptions
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


@pytest.mark.parametrize("outcome", ["succeeds", "refuses", "crashes"])
def test_a_jobs_temporary_logs_stay_only_where_a_crash_needs_them(
    client: Any, outcome: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job without a local output logs to a landcover-dask-* folder of the temporary
    directory: gone once it succeeds (before: left behind), gone when its ranks refused their
    input (the error is that one line, as one process prints it), kept and named for a crash."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = parse_cluster_spec({"engine": "dask", "targetNodeCount": 1, "processesPerNode": 2})
    plan = plan_dask(spec, Job("tests.cluster.dask.outcome_rank", (outcome,)), client=client)
    assert plan.temporary_logs and Path(plan.log_dir).parent == tmp_path
    if outcome == "succeeds":
        result = DaskEngine().launch(plan, LaunchOptions())
        assert result.log_location is None
    else:
        with pytest.raises(LaunchError) as failed:
            DaskEngine().launch(plan, LaunchOptions())
        said = {
            "refuses": "no image files match 'x/*.tif'",
            "crashes": f"dask job failed: internal error: KeyError: 'x' (logs: {plan.log_dir})",
        }
        assert str(failed.value) == said[outcome]
    assert Path(plan.log_dir).exists() == (outcome == "crashes")


def die(unit: str) -> None:
    """A unit that kills the worker process running it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_unit_that_kills_every_worker_it_runs_on_is_one_line() -> None:
    """Before: distributed's KilledWorker ("Attempted to run task ... on 1 different workers,
    ... https://distributed.dask.org/...") as an internal error."""
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
        pytest.raises(LaunchError) as failed,
    ):
        TaskRunner(client, show_progress=False)(die, ["a.tif"], what="sources")
    message = str(failed.value)
    assert message.startswith("sources: task 1 of 1 (sources-"), message
    assert "killed each of the 1 workers that ran it, the last tcp://" in message
    assert "\n" not in message
