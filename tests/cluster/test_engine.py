"""Training arguments: parsed once, completed the same way for every engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.engine import (
    TrainJob,
    parse_train_args,
    plan_job,
    threads_per_worker,
    worker_args,
    write_plan_files,
)
from cluster.errors import ClusterError
from cluster.spec import local_cpu_count, parse_cluster_spec


def test_train_args_are_split_into_store_out_and_options() -> None:
    job = parse_train_args(["train", "chips.zarr", "--epochs", "3", "--out=runs/a", "--resume"])
    assert job == TrainJob("chips.zarr", "runs/a", ("--epochs", "3", "--resume"))
    # no `train` word, store from cluster.json's data.url
    job = parse_train_args(["--out", "r", "--model", "x"], default_store="az://c/chips.zarr")
    assert (job.store, job.out, job.args) == ("az://c/chips.zarr", "r", ("--model", "x"))
    assert parse_train_args(["s", "--out", "r"], entry_module="m").entry_module == "m"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--out", "r"], "no chip store: give it after `train`"),
        (["train", "s"], "the training arguments need --out RUN_DIR"),
        (["train", "s", "--out"], "--out needs a value"),
        (["train", "s", "--out", "a", "--out", "b"], "--out is given twice"),
        (["train", "s", "--out", "a", "--nproc", "2"], "--nproc is for `landcover train`"),
    ],
)
def test_bad_train_args(args: list[str], message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("(", r"\(")):
        parse_train_args(args)


def test_resume_and_threads_are_added_once() -> None:
    spec = parse_cluster_spec({"targetNodeCount": 2, "elastic": {"maxRestarts": 2}})
    job = TrainJob("s", "r", ("--epochs", "1"))
    threads = max(1, local_cpu_count() // 2)
    assert threads_per_worker(spec) == threads
    assert worker_args(spec, job, store="S", out="O") == [
        "S", "--out", "O", "--epochs", "1", "--resume", "--threads", str(threads),
    ]  # fmt: skip
    given = TrainJob("s", "r", ("--resume", "--threads=7"))
    assert worker_args(spec, given, store="s", out="r") == [
        "s",
        "--out",
        "r",
        "--resume",
        "--threads=7",
    ]
    no_restarts = parse_cluster_spec({"targetNodeCount": 1})
    assert "--resume" not in worker_args(no_restarts, job, store="s", out="r")
    # remote engines: a fair share of the VM's vCPUs
    nc24 = parse_cluster_spec(
        {"targetNodeCount": 2, "vmSize": "Standard_NC24s_v3", "engine": "kubernetes",
         "kubernetes": {"image": "i"}}
    )  # fmt: skip
    assert threads_per_worker(nc24) == 24 // 4


def test_plan_files_are_not_overwritten_silently(tmp_path: Path) -> None:
    spec = parse_cluster_spec({"targetNodeCount": 1})
    plan = plan_job(spec, TrainJob("s", str(tmp_path / "run")))
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
