"""A training run as a cluster job: the workers' configuration, the job, the run dir policy."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job
from cluster.local.plan import LocalPlan
from landcover.errors import TrainingError
from landcover.training.config import TrainConfig
from landcover.training.launch import (
    check_run_dir,
    overwrite_once,
    training_job,
    worker_config,
)
from tiling.runtime.machine import local_cpu_count

RESTARTS = {"targetNodeCount": 2, "elastic": {"maxRestarts": 2}}


def test_resume_and_threads_are_added_once() -> None:
    spec = parse_cluster_spec(RESTARTS)
    config = TrainConfig("s", "r", epochs=1)
    threads = max(1, local_cpu_count() // 2)
    job = training_job(spec, config)
    assert job.entry_module == "landcover.training"
    assert job.argv == (
        "${{inputs.store}}", "--out", "${{outputs.run}}", "--epochs", "1", "--resume",
        "--threads", str(threads),
    )  # fmt: skip
    assert (dict(job.inputs), dict(job.outputs)) == ({"store": "s"}, {"run": "r"})
    assert job.bound_argv()[:3] == ["s", "--out", "r"]
    given = replace(config, resume=True, threads=7)
    assert worker_config(spec, given) == given
    no_restarts = parse_cluster_spec({"targetNodeCount": 1})
    assert not worker_config(no_restarts, config).resume
    # with restarts, --overwrite is the launcher's (once), never the restarted workers'
    wipe = worker_config(spec, replace(config, overwrite=True))
    assert (wipe.resume, wipe.overwrite) == (True, False)
    # a remote engine: a fair share of the VM's vCPUs (24 over 4 processes)
    nc24 = parse_cluster_spec(
        {"targetNodeCount": 2, "vmSize": "Standard_NC24s_v3", "engine": "kubernetes",
         "kubernetes": {"image": "i"}}
    )  # fmt: skip
    assert worker_config(nc24, config).threads == 6


def test_storage_options_go_to_the_environment_only() -> None:
    spec = parse_cluster_spec({"targetNodeCount": 1})
    config = TrainConfig("s", "r", storage_options={"account_key": "QWNjb3VudEtleQ=="})
    job = training_job(spec, config, extra_args=["-v"])
    assert job.argv[-1] == "-v" and "QWNjb3VudEtleQ==" not in " ".join(job.argv)
    assert dict(job.secret_env) == {
        "LANDCOVER_STORAGE_OPTIONS": '{"account_key": "QWNjb3VudEtleQ=="}'
    }


def test_an_old_run_is_never_resumed_silently(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_text("old")
    (run / "metrics.jsonl").write_text("{}\n")
    spec = parse_cluster_spec({"targetNodeCount": 1, "elastic": {"maxRestarts": 1}})
    config = TrainConfig("s", str(run))
    with pytest.raises(TrainingError, match=r"already holds a training run \(metrics.jsonl, "):
        check_run_dir(spec, config)
    check_run_dir(spec, replace(config, resume=True))
    check_run_dir(parse_cluster_spec({"targetNodeCount": 1}), config)  # workers refuse it
    # --overwrite: cleared once by the launcher; every worker group itself only resumes
    overwrite = replace(config, overwrite=True)
    check_run_dir(spec, overwrite)
    plan = plan_job(spec, training_job(spec, overwrite))
    assert isinstance(plan, LocalPlan)
    assert plan.agent_commands[0][-3:] == ("--resume", "--threads", str(local_cpu_count()))
    assert "--overwrite" not in plan.agent_commands[0]
    overwrite_once(spec, overwrite)
    launch_plan(replace(plan, agent_commands=((sys.executable, "-c", "pass"),)), LaunchOptions())
    assert sorted(p.name for p in run.iterdir()) == ["logs"]
