"""Jobs, their input and output references, resource shares, and plan files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import (
    Job,
    input_ref,
    output_ref,
    plan_job,
    threads_per_worker,
    write_plan_files,
)
from cluster.errors import ClusterError
from cluster.machine import local_cpu_count
from tests.cluster.fake_worker import fake_job


def test_references_are_bound_to_the_job_inputs_and_outputs() -> None:
    job = Job(
        "m",
        (input_ref("store"), f"--out={output_ref('run')}", "--x", "${{inputs}}"),
        inputs={"store": "az://c/chips.zarr"},
        outputs={"run": "runs/a"},
    )
    assert job.bound_argv() == ["az://c/chips.zarr", "--out=runs/a", "--x", "${{inputs}}"]
    assert job.output_dir == "runs/a" and Job("m").output_dir is None
    with pytest.raises(ClusterError, match=r"job argument '\$\{\{outputs.logs\}\}' names no "):
        Job("m", (output_ref("logs"),), outputs={"run": "r"})


def test_threads_are_a_fair_share_of_each_workers_cores() -> None:
    spec = parse_cluster_spec({"targetNodeCount": 2, "elastic": {"maxRestarts": 2}})
    assert threads_per_worker(spec) == max(1, local_cpu_count() // 2)
    # remote engines: a fair share of the VM's vCPUs
    nc24 = parse_cluster_spec(
        {"targetNodeCount": 2, "vmSize": "Standard_NC24s_v3", "engine": "kubernetes",
         "kubernetes": {"image": "i"}}
    )  # fmt: skip
    assert threads_per_worker(nc24) == 24 // 4


def test_plan_files_are_not_overwritten_silently(tmp_path: Path) -> None:
    spec = parse_cluster_spec({"targetNodeCount": 1})
    plan = plan_job(spec, fake_job("s", str(tmp_path / "run")))
    written = write_plan_files(plan, tmp_path / "plan")
    assert sorted(p.name for p in written) == ["plan.txt", "torchrun.sh"]
    with pytest.raises(ClusterError, match="exists; pass --overwrite"):
        write_plan_files(plan, tmp_path / "plan")
    write_plan_files(plan, tmp_path / "plan", overwrite=True)
    assert not list((tmp_path / "plan").glob(".*tmp*"))


def test_cluster_imports_neither_landcover_nor_torch_nor_the_azure_sdk() -> None:
    code = (
        "import sys\n"
        "import cluster.spec, cluster.engine, cluster.local\n"
        "import cluster.azureml, cluster.kubernetes, cluster.redact\n"
        "print(sorted(m for m in ('torch', 'landcover', 'azure.ai.ml', 'azure.identity')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
