"""The local engine: what it plans, and how it runs, streams, stops and reports agents.

The mechanics (streaming, redaction, stopping the other agents, timeouts) are tested with plain
Python commands standing in for torchrun agents, which start in milliseconds; one real torchrun
launch checks that a failing worker comes back as a LaunchError naming its log. The elastic
restart with real agents is tested through the CLI (tests/landcover/cli/test_cluster.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]
import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import Job, LaunchOptions, launch_plan, plan_job
from cluster.errors import LaunchError
from cluster.local import plan as localplan
from cluster.local.plan import LocalPlan
from cluster.spec import local_spec
from tests.cluster.fake_worker import ENTRY_MODULE, fake_job
from tests.conftest import REPO_ROOT
from tiling.runtime.machine import local_cpu_count


def local_plan(tmp_path: Path, **spec_fields: object) -> LocalPlan:
    spec = parse_cluster_spec(
        {"targetNodeCount": 2, "processesPerNode": 1, "elastic": {"maxRestarts": 2}}
    )
    spec = replace(spec, **spec_fields)  # type: ignore[arg-type]
    plan = plan_job(spec, fake_job("chips.zarr", str(tmp_path / "run"), "--epochs", "2"))
    assert isinstance(plan, LocalPlan)
    return plan


def test_plan_is_one_torchrun_agent_per_simulated_node(tmp_path: Path) -> None:
    plan = local_plan(tmp_path)
    assert len(plan.agent_commands) == 2
    host = plan.rdzv_endpoint
    assert host.startswith("127.0.0.1:")
    threads = max(1, local_cpu_count() // 2)
    for node, command in enumerate(plan.agent_commands):
        text = " ".join(command)
        assert command[:3] == (sys.executable, "-m", "torch.distributed.run")
        assert f"--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {host}" in text
        assert f"--rdzv-conf is_host={1 - min(node, 1)},last_call_timeout=1" in text
        # the run dir takes the place of its reference; the arguments are the job's own
        assert text.endswith(
            f"--max-restarts 2 -m {ENTRY_MODULE} chips.zarr --out {tmp_path / 'run'} --epochs 2"
        )
    assert plan.env["OMP_NUM_THREADS"] == str(threads)
    assert plan.log_dir == str(tmp_path / "run" / "logs")
    script = plan.files()["torchrun.sh"]
    assert script.count("torch.distributed.run") == 2 and 'wait "$pid"' in script
    assert ("OVERSUBSCRIBED" in plan.describe()) == (local_cpu_count() < 2)


def test_more_workers_than_cores_is_marked_oversubscribed(tmp_path: Path) -> None:
    cores = local_cpu_count()
    plan = plan_job(local_spec(cores + 1), fake_job("s", str(tmp_path / "r")))
    assert isinstance(plan, LocalPlan)
    assert plan.oversubscribed and plan.threads_per_worker == 1
    assert f"OVERSUBSCRIBED: {cores + 1} workers on {cores} cores" in plan.describe()
    assert not plan_job(local_spec(1), fake_job("s", "r")).describe().count("OVERSUBSCRIBED")


def scripted_plan(tmp_path: Path, *scripts: str) -> LocalPlan:
    """A local plan whose 'agents' are small Python scripts."""
    plan = local_plan(tmp_path)
    commands = tuple((sys.executable, "-c", s) for s in scripts)
    return replace(plan, agent_commands=commands, agent_env=tuple({} for _ in scripts))


def test_output_is_streamed_and_logged_redacted(tmp_path: Path) -> None:
    key = "QWNjb3VudEtleVNob3VsZE5vdExlYWs="
    plan = scripted_plan(
        tmp_path,
        f"print('epoch 1 done; AccountKey={key};')",
        "import os; print('threads', os.environ['OMP_NUM_THREADS'])",
    )
    lines: list[str] = []
    result = launch_plan(plan, LaunchOptions(on_output=lines.append))
    assert result.status == "succeeded" and result.run_dir == str(tmp_path / "run")
    assert sorted(lines) == [
        "[node 0] epoch 1 done; AccountKey=<redacted>;",
        f"[node 1] threads {plan.env['OMP_NUM_THREADS']}",
    ]
    log = Path(plan.log_path(0)).read_text()
    assert log == "epoch 1 done; AccountKey=<redacted>;\n" and key not in log


def test_a_failing_agent_stops_the_others_and_names_its_log(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    plan = scripted_plan(
        tmp_path,
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)",
        "import sys, time; time.sleep(0.5); print('[rank1]: error: x.zarr: no chip store');"
        " sys.exit(3)",
    )
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions())
    assert str(info.value) == (
        "training failed on simulated node 1 (exit code 3): x.zarr: no chip store; "
        f"logs: {tmp_path / 'run' / 'logs' / 'node-1.log'}"
    )
    assert not psutil.pid_exists(int(pid_file.read_text()))


def test_a_job_without_a_process_group_starts_its_ranks_directly(tmp_path: Path) -> None:
    job = replace(fake_job("s", str(tmp_path / "run"), "--epochs", "1"), process_group=False)
    plan = plan_job(local_spec(3), job)
    assert isinstance(plan, LocalPlan) and plan.direct
    port = plan.rdzv_endpoint.rpartition(":")[2]
    for rank, (command, env) in enumerate(zip(plan.agent_commands, plan.agent_env, strict=True)):
        assert command == (sys.executable, "-m", ENTRY_MODULE, "s", "--out", str(tmp_path / "run"),
                           "--epochs", "1")  # fmt: skip
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")} == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "3", "MASTER_PORT": port
        }  # fmt: skip
    assert "started directly" in plan.describe() and "torch.distributed.run" not in plan.describe()
    assert plan.log_path(2).endswith("rank-2.log")
    assert "torch.distributed.run" not in plan.files()["torchrun.sh"]
    # several simulated nodes or restarts need torchrun's agents, whatever the job
    two_nodes = replace(local_spec(2), node_count=2, processes_per_node=1)
    for spec in (two_nodes, local_spec(2, max_restarts=1)):
        torchrun = plan_job(spec, job)
        assert isinstance(torchrun, LocalPlan) and not torchrun.direct
    assert (
        not plan_job(local_spec(3), replace(job, process_group=True))
        .describe()
        .count("started directly")
    )


def test_ranks_started_directly_report_as_ranks(tmp_path: Path) -> None:
    plan = scripted_plan(
        tmp_path, "print('rank 0 here')", "import sys, time; time.sleep(0.3); sys.exit(3)"
    )
    plan = replace(plan, direct=True)
    lines: list[str] = []
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions(on_output=lines.append))
    assert lines == ["[rank 0] rank 0 here"]
    assert str(info.value) == (
        f"rank 1 failed (exit code 3); logs: {tmp_path / 'run' / 'logs' / 'rank-1.log'}"
    )


def test_a_rank_killed_by_a_signal_is_the_cause(tmp_path: Path) -> None:
    """Issue 41: a rank that a signal killed leaves no error of its own."""
    plan = scripted_plan(
        tmp_path, "import time; time.sleep(30)", "import os; os.kill(os.getpid(), 9)"
    )
    with pytest.raises(LaunchError) as info:
        launch_plan(replace(plan, direct=True), LaunchOptions())
    assert str(info.value) == (
        f"rank 1 died: killed by signal 9 (SIGKILL) (worker logs: {tmp_path / 'run' / 'logs'}/)"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ddp_rank_killed_under_torchrun_is_the_cause_not_the_others_gloo_error(
    tmp_path: Path,
) -> None:
    """Issue 41: rank 1 SIGKILLs itself after epoch 1; rank 0 then fails in its all-reduce.
    Before: "training failed on simulated node 0 (exit code 1): RuntimeError: [gloo] ...
    Connection reset by peer"."""
    spec = parse_cluster_spec({"targetNodeCount": 1, "processesPerNode": 2})
    job = fake_job("chips.zarr", str(tmp_path / "run"), "--epochs", "3", "--die-at-epoch", "1")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    with pytest.raises(LaunchError) as info:
        launch_plan(plan_job(spec, job), LaunchOptions(env=env, cwd=str(REPO_ROOT)))
    assert str(info.value) == (
        f"rank 1 died: killed by signal 9 (SIGKILL) (worker logs: {tmp_path / 'run' / 'logs'}/)"
    )


def test_a_job_past_its_time_limit_is_stopped(tmp_path: Path) -> None:
    plan = scripted_plan(tmp_path, "import time; time.sleep(120)")
    with pytest.raises(LaunchError, match=r"did not finish within 1 s and was stopped; logs: "):
        launch_plan(plan, LaunchOptions(timeout_s=1))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failing_worker_under_torchrun_is_a_launch_error(tmp_path: Path) -> None:
    spec = parse_cluster_spec({"targetNodeCount": 1, "processesPerNode": 1})
    job = fake_job("chips.zarr", str(tmp_path / "run"), "--fail")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    with pytest.raises(LaunchError) as info:
        launch_plan(plan_job(spec, job), LaunchOptions(env=env, cwd=str(REPO_ROOT)))
    log = tmp_path / "run" / "logs" / "node-0.log"
    assert str(info.value) == (
        "training failed on simulated node 0 (exit code 1): "
        f"ValueError: fake worker failing on purpose; logs: {log}"
    )
    assert "fake worker failing on purpose" in log.read_text()


@pytest.mark.parametrize(
    ("gpus", "nodes", "per_node", "expected"),
    [
        (0, 2, 1, [{}, {}]),
        (1, 1, 1, [{}]),
        (4, 2, 2, [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]),
        (1, 2, 1, [{"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": ""}]),
    ],
)
def test_simulated_nodes_share_out_the_gpus_or_use_none(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpus: int,
    nodes: int,
    per_node: int,
    expected: list[dict[str, str]],
) -> None:
    monkeypatch.setattr(localplan, "local_gpu_count", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = local_plan(tmp_path, node_count=nodes, processes_per_node=per_node)
    assert [dict(e) for e in plan.agent_env] == expected
    hidden = expected[0].get("CUDA_VISIBLE_DEVICES") == ""
    assert ("GPUs hidden, workers train on CPU" in plan.describe()) == hidden


def test_the_first_failing_ranks_own_error_is_the_one_line_reported(tmp_path: Path) -> None:
    """Rank 1 fails first; rank 0 fails after it (because of it) and its node exits first. One
    line gives rank 1's own error and the logs; the terminal shows neither traceback nor the
    ranks' error lines, which stay in the logs."""
    log_dir = tmp_path / "run" / "logs"
    wait_for = (
        "import os, sys, time\n"
        "def wait_for(name):\n"
        "    while not os.path.exists(name): time.sleep(0.05)\n"
    )
    record = "from cluster.failures import record_worker_error\n"
    plan = scripted_plan(
        tmp_path,
        wait_for + record + "print('epoch 1 done', flush=True)\n"
        f"wait_for({str(log_dir / 'rank-1.error')!r})\n"
        "record_worker_error('internal error: RuntimeError: Connection closed by peer', rank=0)\n"
        "print('[rank0]: Traceback (most recent call last):')\n"
        "print('[rank0]:   File \"train.py\", line 1')\n"
        "print('[rank0]: RuntimeError: Connection closed by peer')\nsys.exit(1)\n",
        wait_for + record + "record_worker_error('x.zarr: no chip store', rank=1)\n"
        "print('[rank1]: error: x.zarr: no chip store', flush=True)\n"
        f"wait_for({str(log_dir / 'rank-0.error')!r})\ntime.sleep(5)\nsys.exit(2)\n",
    )
    log_dir.mkdir(parents=True)
    stale = '{"rank": 0, "attempt": 9, "time_s": 1.0, "message": "an earlier launch"}'
    (log_dir / "rank-0.error").write_text(stale)
    lines: list[str] = []
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions(on_output=lines.append, env=env))
    assert str(info.value) == f"x.zarr: no chip store (worker logs: {log_dir}/)"
    assert lines == ["[node 0] epoch 1 done"]
    logs = Path(plan.log_path(0)).read_text() + Path(plan.log_path(1)).read_text()
    assert "Traceback" in logs and "error: x.zarr: no chip store" in logs


OUTCOMES = {
    "succeeds": "print('done')",
    "refuses": "record_worker_error(\"no image files match 'x/*.tif'\", rank=0, bad_input=True)\n"
    "sys.exit(2)",
    "crashes": "record_worker_error(\"internal error: KeyError: 'x'\", rank=0)\nsys.exit(3)",
}


@pytest.mark.parametrize("keep_logs", [True, False], ids=["kept", "streamed"])
@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_a_streamed_jobs_temporary_logs_stay_only_where_a_crash_needs_them(
    outcome: str, keep_logs: bool
) -> None:
    """A job's logs in the temporary directory go once it succeeds (issue 41: `cluster
    launch` left landcover-launch-* folders behind); `--nproc` streams every line, so they go
    too when its ranks refuse their input (the error is one line); a crash keeps them."""
    job = Job(ENTRY_MODULE, ("x",), process_group=False)  # no output dir: temporary logs
    plan = plan_job(local_spec(1), job)
    assert isinstance(plan, LocalPlan) and plan.temporary_logs
    script = "import sys\nfrom cluster.failures import record_worker_error\n" + OUTCOMES[outcome]
    plan = replace(plan, agent_commands=((sys.executable, "-c", script),))
    log_dir = Path(plan.log_dir)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    options = LaunchOptions(env=env, keep_logs=keep_logs)
    try:
        if outcome == "succeeds":
            result = launch_plan(plan, options)
            assert result.log_location is None
        else:
            with pytest.raises(LaunchError) as info:
                launch_plan(plan, options)
            named = str(info.value).endswith(f"(worker logs: {log_dir}/)")
            assert named == (keep_logs or outcome == "crashes")
        assert log_dir.exists() == (outcome == "crashes" or (outcome == "refuses" and keep_logs))
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def test_secrets_reach_the_workers_only_through_their_environment(tmp_path: Path) -> None:
    key = "QWNjb3VudEtleVNob3VsZE5vdExlYWs="
    options = json.dumps({"account_name": "acct", "account_key": key})
    spec = parse_cluster_spec({"targetNodeCount": 1, "processesPerNode": 1})
    job = fake_job("s", str(tmp_path / "run"), secret_env={"LANDCOVER_STORAGE_OPTIONS": options})
    plan = plan_job(spec, job)
    assert isinstance(plan, LocalPlan)
    assert not any(key in arg for command in plan.agent_commands for arg in command)
    shown = plan.describe() + repr(plan) + repr(job) + "".join(plan.files().values())
    assert key not in shown and "LANDCOVER_STORAGE_OPTIONS=<redacted>" in plan.describe()
    assert ': "${LANDCOVER_STORAGE_OPTIONS:?export' in plan.files()["torchrun.sh"]
    # the worker gets them; whatever it prints of them is scrubbed from output and logs
    agent = (
        "import hashlib, json, os; o = json.loads(os.environ['LANDCOVER_STORAGE_OPTIONS']); "
        "print(hashlib.sha256(o['account_key'].encode()).hexdigest()); print(o['account_key'])"
    )
    plan = replace(plan, agent_commands=((sys.executable, "-c", agent),), agent_env=({},))
    lines: list[str] = []
    launch_plan(plan, LaunchOptions(on_output=lines.append))
    assert lines == [hashlib.sha256(key.encode()).hexdigest(), "<redacted>"]
    assert key not in Path(plan.log_path(0)).read_text()
