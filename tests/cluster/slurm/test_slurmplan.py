"""The sbatch script of the slurm engine: what it asks SLURM for, what it runs, and that the
job's secrets stay out of it and out of the plan."""

from __future__ import annotations

from pathlib import Path

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import plan_job
from cluster.slurm.plan import SCRIPT_NAME, SlurmPlan
from tests.cluster.fake_worker import fake_job
from tests.support.clusterspecs import SECRET, slurm_plan

FULL_SLURM = {
    "partition": "gpu",
    "account": "proj-42",
    "timeLimit": "02:00:00",
    "gpusPerNode": 2,
    "cpusPerTask": 6,
    "setup": ["module load cuda/12", "source venv/bin/activate"],
    "extraDirectives": ["--exclusive", "#SBATCH --mem=0"],
    "socketInterface": "ib0",
}


def directives(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def test_script_asks_for_the_nodes_tasks_and_resources(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path / "run", FULL_SLURM)
    script = plan.files()[SCRIPT_NAME]
    logs = tmp_path / "run" / "logs"
    assert directives(script) == [
        "--job-name=landcover",
        "--nodes=2",
        "--ntasks-per-node=2",  # one task per GPU: processesPerNode "auto"
        "--cpus-per-task=6",
        "--gres=gpu:2",
        "--time=02:00:00",
        "--partition=gpu",
        "--account=proj-42",
        f"--output={logs}/slurm-%j.out",
        f"--error={logs}/slurm-%j.out",
        "--export=ALL",
        "--exclusive",
        "--mem=0",
    ]
    body = script.splitlines()
    # the setup runs first, then the environment every task inherits
    assert body.index("module load cuda/12") < body.index("source venv/bin/activate")
    assert body.index("source venv/bin/activate") < body.index("export OMP_NUM_THREADS=6")
    for line in (
        "export GLOO_SOCKET_IFNAME=ib0",
        "export NCCL_SOCKET_IFNAME=ib0",
        f"export LANDCOVER_ERROR_DIR={logs}",
    ):
        assert line in body
    # the master is the first node's address, resolved on the node; the port from the job id
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert 'grep -o "NodeAddr=[^ ]*"' in script
    assert "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 10000 ))" in body
    # one process per task, no torchrun: ranks come from SLURM's own variables
    assert body[-1] == (
        f"exec srun --kill-on-bad-exit=1 --output={logs}/job-%j-rank-%t.log python -m "
        f"tests.cluster.fake_worker /shared/chips.zarr --out {tmp_path / 'run'} --epochs 3"
    )
    assert "torch.distributed.run" not in script and "torchrun" not in script


def test_a_bare_spec_leaves_resources_to_slurm(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path / "run")
    options = directives(plan.files()[SCRIPT_NAME])
    assert options[:3] == ["--job-name=landcover", "--nodes=2", "--ntasks-per-node=1"]
    assert not [
        o for o in options if o.startswith(("--gres", "--cpus", "--time", "--part", "--acc"))
    ]
    assert "GLOO_SOCKET_IFNAME" not in plan.files()[SCRIPT_NAME]
    # a known VM size gives the CPUs per task: its vCPUs shared by its tasks
    sized = slurm_plan(tmp_path / "run", vmSize="Standard_NC24s_v3")
    assert "--cpus-per-task=6" in directives(sized.files()[SCRIPT_NAME])


def test_secrets_stay_out_of_the_script_and_the_plan(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path / "run", FULL_SLURM)
    script, text = plan.files()[SCRIPT_NAME], plan.describe()
    assert SECRET not in script and SECRET not in text and "account_key" not in script
    # the script only checks that the submitting environment has the secret
    assert (
        ': "${LANDCOVER_STORAGE_OPTIONS:?export LANDCOVER_STORAGE_OPTIONS before sbatch' in script
    )
    assert "LANDCOVER_STORAGE_OPTIONS=<redacted>" in text
    assert "engine: slurm" in text and "2 node(s) x 2 task(s) = 4 worker(s)" in text
    assert (
        f"submit: mkdir -p {tmp_path / 'run' / 'logs'} && sbatch --parsable {SCRIPT_NAME}" in text
    )
    assert f"note: {tmp_path / 'run'} must be on a filesystem every node shares" in text


def test_a_url_output_keeps_the_logs_in_the_submission_directory() -> None:
    job = fake_job("az://chips/c.zarr", "az://runs/a")
    plan = plan_job(parse_cluster_spec({"engine": "slurm", "targetNodeCount": 1}), job)
    assert isinstance(plan, SlurmPlan) and plan.log_dir == "slurm-logs/landcover"
