"""The slurm engine: how it submits, follows and reports a job (its script: test_slurmplan).

Offline, sbatch, scontrol and scancel are small shell scripts on PATH that play a job's states
from a file. With the real SLURM testbed (`slurm_testbed`, root only) jobs of the stand-in
worker run across two emulated nodes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import LaunchOptions, LaunchResult, get_engine, launch_plan, plan_job
from cluster.errors import EngineUnavailableError, LaunchError
from cluster.slurm import engine as slurm
from cluster.slurm.plan import SCRIPT_NAME, SlurmPlan
from tests.cluster.fake_worker import fake_job
from tests.conftest import REPO_ROOT
from tests.support.clusterspecs import SECRET, slurm_plan
from tests.support.slurm_testbed import SlurmTestbed

# ----------------------------------------------------------------------------- launching, offline

_SBATCH = """#!/usr/bin/env bash
echo "$@" >> "$FAKE/sbatch.args"
echo "${LANDCOVER_STORAGE_OPTIONS:-unset}" > "$FAKE/sbatch.secret"
if [ -e "$FAKE/refuse" ]; then
  echo "sbatch: error: Invalid partition name specified" >&2; exit 1
fi
if [ -x "$FAKE/on_submit" ]; then "$FAKE/on_submit"; fi
echo "42;testcluster"
"""
# plays $FAKE/states one line per query ("STATE EXIT[|line for rank 0's log]"), then the last
_SCONTROL = """#!/usr/bin/env bash
n=$(( $(cat "$FAKE/count" 2>/dev/null || echo 0) + 1 )); echo $n > "$FAKE/count"
line=$(sed -n "${n}p" "$FAKE/states"); [ -n "$line" ] || line=$(tail -n 1 "$FAKE/states")
state=${line%%|*}
if [ "$state" != "$line" ]; then echo "${line#*|}" >> "$FAKE_RANK0_LOG"; fi
if [ "$state" = GONE ]; then echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi
if [ "$state" = DOWN ]; then
  echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1
fi
if [ "$state" = TERM ]; then kill -TERM "$PPID"; state="RUNNING 0:0"; fi
set -- $state
echo "JobId=42 JobName=landcover JobState=$1 Reason=None ExitCode=$2 NodeList=n[0-1]"
"""
_SCANCEL = """#!/usr/bin/env bash
echo "$@" >> "$FAKE/scancel.args"
"""


@dataclass
class FakeSlurm:
    dir: Path
    plan: SlurmPlan
    env: dict[str, str]

    @property
    def log_dir(self) -> Path:
        return Path(self.plan.log_dir)

    def states(self, *lines: str) -> None:
        (self.dir / "states").write_text("".join(line + "\n" for line in lines))

    def on_submit(self, shell: str) -> None:
        path = self.dir / "on_submit"
        path.write_text("#!/usr/bin/env bash\n" + shell + "\n")
        path.chmod(0o755)

    def calls(self, tool: str) -> list[str]:
        path = self.dir / f"{tool}.args"
        return path.read_text().splitlines() if path.exists() else []

    def launch(
        self, *, wait: bool = True, timeout_s: float | None = None
    ) -> tuple[list[str], LaunchResult]:
        lines: list[str] = []
        options = LaunchOptions(
            on_output=lines.append, wait=wait, timeout_s=timeout_s, env=self.env
        )
        return lines, launch_plan(self.plan, options)


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = tmp_path / "fake"
    bin_dir = fake / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("sbatch", _SBATCH), ("scontrol", _SCONTROL), ("scancel", _SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setattr(slurm, "POLL_S", 0.01)
    plan = slurm_plan(tmp_path / "run")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE": str(fake),
        "FAKE_RANK0_LOG": str(plan.rank_log("42", 0)),
    }
    return FakeSlurm(fake, plan, env)


def test_launch_follows_the_job_and_streams_rank_0(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states(
        "PENDING 0:0",
        "RUNNING 0:0|epoch 1 done",
        f"RUNNING 0:0|loss 0.5 {SECRET}",
        "COMPLETED 0:0|epoch 2 done",
    )
    lines, result = fake_slurm.launch()
    assert lines == [
        "[slurm] job 42 PENDING",
        "[slurm] job 42 RUNNING on n[0-1]",
        "epoch 1 done",
        "loss 0.5 <redacted>",
        "epoch 2 done",
        "[slurm] job 42 COMPLETED on n[0-1]",
    ]
    assert result == LaunchResult(
        engine="slurm",
        job_id="42",
        status="succeeded",
        run_dir=str(fake_slurm.plan.job.output_dir),
        log_location=str(fake_slurm.log_dir),
        wall_time_s=result.wall_time_s,
    )
    # submitted with the secret in sbatch's environment, never in the script it wrote
    script = fake_slurm.log_dir / SCRIPT_NAME
    assert fake_slurm.calls("sbatch") == [f"--parsable {script}"]
    assert SECRET in (fake_slurm.dir / "sbatch.secret").read_text()
    assert SECRET not in script.read_text() and os.access(script, os.X_OK)
    assert fake_slurm.calls("scancel") == []


def test_logs_of_an_earlier_job_with_the_same_id_are_not_followed(
    fake_slurm: FakeSlurm,
) -> None:
    """A re-created cluster (the testbed) numbers its jobs from 1 again: job 42's logs from
    before this submission are not this job's."""
    fake_slurm.log_dir.mkdir(parents=True, exist_ok=True)
    stale = [fake_slurm.plan.rank_log("42", r) for r in (0, 1)] + [fake_slurm.plan.batch_log("42")]
    for path in stale:
        Path(path).write_text("epoch 9 done (an old job)\n")
        os.utime(path, (time.time() - 60, time.time() - 60))
    fake_slurm.states("RUNNING 0:0|epoch 1 done", "COMPLETED 0:0")
    lines, _ = fake_slurm.launch()
    assert "epoch 9 done (an old job)" not in lines
    assert "epoch 1 done" in lines
    assert not Path(stale[1]).exists()


def test_without_wait_the_job_is_only_submitted(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states("RUNNING 0:0")
    lines, result = fake_slurm.launch(wait=False)
    assert (result.status, result.job_id, lines) == ("submitted", "42", [])
    assert not (fake_slurm.dir / "count").exists()  # never queried


def test_a_failed_rank_is_reported_by_its_own_error(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states("RUNNING 0:0", "FAILED 1:0")
    (fake_slurm.log_dir).mkdir(parents=True)
    (fake_slurm.log_dir / "rank-0.error").write_text("stale: from an earlier job")
    record = {"rank": 1, "attempt": 0, "time_s": 1.0, "message": f"bad key {SECRET}"}
    error_file = fake_slurm.log_dir / "rank-1.error"
    fake_slurm.on_submit(f"echo '{json.dumps(record)}' > {error_file}")
    with pytest.raises(LaunchError) as info:
        fake_slurm.launch()
    assert str(info.value) == (
        f"bad key <redacted> (SLURM job 42 FAILED, exit code 1; worker logs: {fake_slurm.log_dir}/)"
    )


def test_a_killed_rank_is_reported_by_srun_and_the_exit_status(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states(
        "RUNNING 0:0|epoch 1 done",
        "RUNNING 0:0|Traceback (most recent call last):",
        "RUNNING 0:0|  File x.py",
        "RUNNING 0:0|RuntimeError: Connection closed by peer",
        "FAILED 137:0|more noise after the failure",
    )
    batch_log = fake_slurm.plan.batch_log("42")
    fake_slurm.on_submit(
        f"printf 'landcover: nodes n[0-1]\\nsrun: error: n1: task 1: Killed\\n"
        f"srun: error: n0: task 0: Terminated\\n' > {batch_log}"
    )
    lines: list[str] = []
    options = LaunchOptions(on_output=lines.append, wait=True, env=fake_slurm.env)
    with pytest.raises(LaunchError) as info:
        launch_plan(fake_slurm.plan, options)
    # the traceback and what follows it are failure noise: the error says it once
    assert lines == [
        "[slurm] job 42 RUNNING on n[0-1]",
        "epoch 1 done",
        "[slurm] job 42 FAILED on n[0-1]",
    ]
    assert str(info.value) == (
        f"SLURM job 42 FAILED, exit code 137: n1: task 1: Killed; logs: {fake_slurm.log_dir}/"
    )


def test_a_refused_submission_and_a_vanished_job_are_one_line(fake_slurm: FakeSlurm) -> None:
    (fake_slurm.dir / "refuse").touch()
    with pytest.raises(
        LaunchError, match=r"^sbatch refused the job: sbatch: error: Invalid partition"
    ):
        fake_slurm.launch()
    (fake_slurm.dir / "refuse").unlink()
    fake_slurm.states("GONE")
    with pytest.raises(LaunchError, match=r"^SLURM job 42 no longer known to SLURM; logs: "):
        fake_slurm.launch()


def test_ctrl_c_while_following_cancels_the_job(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states("RUNNING 0:0|epoch 1 done")

    def interrupt(line: str) -> None:
        if line == "epoch 1 done":
            raise KeyboardInterrupt

    options = LaunchOptions(on_output=interrupt, wait=True, env=fake_slurm.env)
    with pytest.raises(KeyboardInterrupt):
        launch_plan(fake_slurm.plan, options)
    assert fake_slurm.calls("scancel") == ["42"]


def test_sigterm_while_following_cancels_the_job(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states("RUNNING 0:0", "TERM")
    with pytest.raises(SystemExit) as info:
        fake_slurm.launch()
    assert info.value.code == 143
    assert fake_slurm.calls("scancel") == ["42"]


def test_a_timeout_stops_following_but_leaves_the_job(fake_slurm: FakeSlurm) -> None:
    fake_slurm.states("RUNNING 0:0")
    with pytest.raises(
        LaunchError,
        match=r"^SLURM job 42 did not finish within 0.05 s and is "
        r"still RUNNING: follow it with `squeue -j 42` or cancel it with `scancel 42`",
    ):
        fake_slurm.launch(timeout_s=0.05)
    assert fake_slurm.calls("scancel") == []


def test_without_sbatch_the_engine_says_where_to_run(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path / "run")
    options = LaunchOptions(wait=True, env={"PATH": str(tmp_path)})
    with pytest.raises(
        EngineUnavailableError, match="sbatch not found on PATH: launch from a SLURM"
    ):
        get_engine("slurm").launch(plan, options)


def test_a_controller_that_does_not_answer_is_asked_again(
    fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_slurm.states("DOWN", "DOWN", "COMPLETED 0:0")
    _, result = fake_slurm.launch()
    assert result.status == "succeeded"
    monkeypatch.setattr(slurm, "MAX_QUERY_FAILURES", 2)
    (fake_slurm.dir / "count").unlink()
    with pytest.raises(LaunchError, match=r"^scontrol show job 42 failed: slurm_load_jobs error"):
        fake_slurm.launch()


# ----------------------------------------------------------------------------- a real SLURM cluster


def launch_on_testbed(
    bed: SlurmTestbed,
    run_dir: Path,
    *args: str,
    on_output: Callable[[str], None] | None = None,
) -> LaunchResult:
    """The stand-in worker as a 2-node x 1-task job on the testbed, followed to its end."""
    spec = parse_cluster_spec(
        {
            "engine": "slurm",
            "targetNodeCount": 2,
            "processesPerNode": 1,
            "slurm": {"timeLimit": "00:05:00", "socketInterface": bed.interface},
        }
    )
    plan = plan_job(spec, fake_job("chips.zarr", str(run_dir), *args))
    # the nodes run this interpreter on this checkout (sbatch passes the environment on)
    path = f"{Path(sys.executable).parent}:{bed.env['PATH']}"
    env = {**bed.env, "PATH": path, "PYTHONPATH": str(REPO_ROOT)}
    options = LaunchOptions(
        on_output=on_output, wait=True, timeout_s=240, env=env, cwd=str(REPO_ROOT)
    )
    return launch_plan(plan, options)


def starts(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "starts.jsonl").read_text().splitlines()]


def test_a_two_node_job_runs_one_rank_on_each_node(
    slurm_testbed: SlurmTestbed, tmp_path: Path
) -> None:
    lines: list[str] = []
    result = launch_on_testbed(slurm_testbed, tmp_path / "run", on_output=lines.append)
    assert result.status == "succeeded" and result.run_dir == str(tmp_path / "run")
    (start,) = starts(tmp_path / "run")
    assert (start["world_size"], start["nodes"]) == (2, 2)
    assert [p["node"] for p in start["placement"]] == ["n0", "n1"]  # rank r on node r
    # 2 epochs of all-reducing rank + 1 over 2 ranks: nothing lost or repeated
    assert read_metrics_total(tmp_path / "run") == 2 * 3
    assert f"[slurm] job {result.job_id} RUNNING on n[0-1]" in lines
    assert "rank 0 done: total 6.0" in lines


def read_metrics_total(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return float(json.loads(lines[-1])["total"])


def test_a_killed_rank_fails_the_job_and_resume_continues(
    slurm_testbed: SlurmTestbed, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = ("--epochs", "3", "--die-at-epoch", "1", "--die-rank", "1")
    with pytest.raises(LaunchError) as info:
        launch_on_testbed(slurm_testbed, run_dir, *args)
    # one line: the job's state and exit status, and which task died how
    assert re.fullmatch(
        rf"SLURM job \d+ FAILED, exit code [1-9]\d*: n1: task 1: Killed; logs: {run_dir}/logs/",
        str(info.value),
    ), str(info.value)
    assert read_metrics_total(run_dir) == 3  # epoch 1 was checkpointed
    result = launch_on_testbed(slurm_testbed, run_dir, *args, "--resume")
    assert result.status == "succeeded"
    first, resumed = starts(run_dir)
    assert (first["resumed_from_epoch"], resumed["resumed_from_epoch"]) == (0, 1)
    assert read_metrics_total(run_dir) == 3 * 3  # epochs 2 and 3 added once each


def test_ctrl_c_cancels_a_real_job(slurm_testbed: SlurmTestbed, tmp_path: Path) -> None:
    seen: list[str] = []

    def interrupt_when_running(line: str) -> None:
        seen.append(line)
        if " RUNNING " in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch_on_testbed(slurm_testbed, tmp_path / "run", on_output=interrupt_when_running)
    job_id = seen[-1].split()[2]
    env = {**os.environ, **slurm_testbed.env}
    for _ in range(100):  # scancel is asynchronous: the job goes CANCELLED shortly
        state = slurm.query_job(job_id, env, None)
        if state is None or state.state == "CANCELLED":
            break
        time.sleep(0.1)
    assert state is None or state.state == "CANCELLED"
