"""`landcover cluster plan|launch` and `landcover scale` through the CLI.

The launches use tests/cluster/fake_worker.py as the entry module (the engines know nothing of
models); the last test runs the real trainer on the tiny store.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from click.testing import CliRunner

from cluster.azureml import engine as azureml
from cluster.engine import Job, LaunchOptions, LaunchResult, Plan
from cluster.errors import LaunchError
from cluster.local import agents
from landcover.cli.app import main
from landcover.cli.cluster import train_config
from landcover.cli.train import worker_command
from landcover.errors import TrainingError
from landcover.scaling import sweep
from tests.conftest import REPO_ROOT
from tests.support.chipstores import incomplete_copy, incomplete_store_error
from tests.support.cli import invoke
from tests.support.clusterspecs import (
    ACCOUNT_KEY,
    AZUREML_SPEC,
    KUBERNETES_SPEC,
    write_json,
)
from tests.support.slurm_testbed import SlurmTestbed, two_node_slurm_job
from tiling.runtime.machine import local_cpu_count

REPO_CLUSTER_JSON = REPO_ROOT / "cluster.json"
FAKE_WORKER = "tests.cluster.fake_worker"
SAS_SIG = "c2lnbmF0dXJlLW9mLXRoZS1zYXMtdG9rZW4"


@pytest.mark.parametrize(
    ("document", "files", "first_line"),
    [
        (None, {"torchrun.sh"}, "engine: local"),
        (AZUREML_SPEC, {"job.yaml", "compute.yaml"}, "engine: azureml"),
        (KUBERNETES_SPEC, {"trainjob.yaml", "secret.yaml"}, "engine: kubernetes"),
        (
            {**KUBERNETES_SPEC, "kubernetes": {"api": "pytorchjob", "image": "i"}},
            {"pytorchjob.yaml", "secret.yaml"},
            "engine: kubernetes",
        ),
    ],
)
def test_plan_prints_and_writes_the_files_without_secrets(
    tmp_path: Path, document: dict[str, Any] | None, files: set[str], first_line: str
) -> None:
    spec = REPO_CLUSTER_JSON if document is None else write_json(tmp_path / "c.json", document)
    store = f"https://landcoverdata.blob.core.windows.net/chips/naip.zarr?sv=2022&sig={SAS_SIG}"
    result = invoke(
        "cluster", "plan", str(spec), "--out", str(tmp_path / "plan"),
        "--", "train", store, "--out", "/shared/run", "--epochs", "2",
        "--storage-options", f'{{"account_key": "{ACCOUNT_KEY}"}}',
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(first_line)
    written = {p.name for p in (tmp_path / "plan").iterdir()}
    assert written == files | {"plan.txt"}
    texts = [result.output, *((tmp_path / "plan" / name).read_text() for name in written)]
    for text in texts:
        assert SAS_SIG not in text and ACCOUNT_KEY not in text
        # storage options go to the workers as environment, not as an argument
        assert "--storage-options" not in text
    assert any("<redacted>" in t for t in texts[1:])
    assert any("LANDCOVER_STORAGE_OPTIONS" in t for t in texts[1:])
    # the plan files are what launch would use
    if "pytorchjob.yaml" in files:
        manifest = yaml.safe_load((tmp_path / "plan" / "pytorchjob.yaml").read_text())
        assert manifest["spec"]["elasticPolicy"]["maxRestarts"] == 1
    if "trainjob.yaml" in files:
        manifest = yaml.safe_load((tmp_path / "plan" / "trainjob.yaml").read_text())
        assert manifest["spec"]["trainer"]["args"][:2] == ["--max-restarts", "1"]


def test_bad_input_is_one_line_with_exit_code_2(tmp_path: Path) -> None:
    zero = write_json(tmp_path / "zero.json", {"targetNodeCount": 0})
    result = invoke("cluster", "plan", str(zero), "--", "train", "s", "--out", "r")
    assert result.exit_code == 2
    assert result.stderr == f"error: {zero}: targetNodeCount must be >= 1, got 0\n"
    result = invoke("cluster", "launch", str(REPO_CLUSTER_JSON), "--", "train", "s")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: the training arguments need --out RUN_DIR (where the run directory goes)\n"
    )
    result = invoke("scale", "s", "--workers", "1,two", "--epochs", "1", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert (
        result.stderr == "error: --workers '1,two': 'two' is not a whole number; give e.g. 1,2,4\n"
    )


@pytest.mark.timeout(60)
def test_remote_launch_without_credentials_or_kubectl_fails_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no az, no kubectl
    monkeypatch.setattr(azureml, "IMDS_URL", "http://127.0.0.1:9/metadata/instance")
    aml = write_json(tmp_path / "aml.json", AZUREML_SPEC)
    result = invoke("cluster", "launch", str(aml), "--", "train", "az://chips/x.zarr", "--out", "r")
    assert result.exit_code == 2
    # the plan, then one line saying what to do
    assert result.stderr.startswith("engine: azureml")
    assert result.stderr.splitlines()[-1].startswith(
        "error: no Azure credentials found: run `az login`"
    )
    k8s = write_json(tmp_path / "k8s.json", KUBERNETES_SPEC)
    result = invoke("cluster", "launch", str(k8s), "--", "train", "az://chips/x.zarr", "--out", "r")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("error: kubectl not found on PATH")


@pytest.fixture()
def fake_worker_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's workers find `tests.cluster.fake_worker` from any working directory."""
    paths = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("fake_worker_importable")
def test_killed_worker_is_restarted_and_resumes_with_nothing_lost(tmp_path: Path) -> None:
    """The repo's cluster.json: 2 simulated nodes, maxRestarts 1. Rank 1 SIGKILLs itself after
    epoch 1's checkpoint; the job still finishes all 3 epochs, each exactly once."""
    run = tmp_path / "run"
    result = invoke(
        "cluster", "launch", str(REPO_CLUSTER_JSON), "--entry-module", FAKE_WORKER,
        "--", "train", "chips.zarr", "--out", str(run), "--epochs", "3", "--die-at-epoch", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fake worker rank 1 killing itself after epoch 1" in result.stdout
    assert "done: local job landcover-local-" in result.stdout
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    assert all((m["world_size"], m["nodes"]) == (2, 2) for m in metrics)
    # each epoch adds 1 + 2 over the two ranks: a lost or repeated epoch changes the total
    assert metrics[-1]["total"] == 3 * 3
    starts = read_jsonl(run / "starts.jsonl")
    assert [s["resumed_from_epoch"] for s in starts] == [0, 1]
    threads = str(max(1, local_cpu_count() // 2))
    argv = starts[0]["argv"]
    assert argv[:3] == ["chips.zarr", "--out", str(run)]
    assert "--resume" in argv and argv[argv.index("--threads") + 1] == threads
    assert starts[0]["omp_num_threads"] == threads
    assert {p.name for p in (run / "logs").iterdir()} == {"node-0.log", "node-1.log"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("fake_worker_importable")
def test_scale_trains_at_each_worker_count_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    result = invoke(
        "scale", "chips.zarr", "--workers", "2,1", "--epochs", "2", "--out", str(out),
        "--entry-module", FAKE_WORKER, "--", "--sleep-s", "0.2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = result.stdout.splitlines()
    assert table[0].split()[:3] == ["workers", "nodes", "x"]
    assert [line.split()[0] for line in table[1:3]] == ["1", "2"]
    assert table[-1] == f"sweep: {out / 'sweep.json'}"
    sweep = json.loads((out / "sweep.json").read_text())
    cores = local_cpu_count()
    assert sweep["cores"] == cores and sweep["train_args"] == ["--sleep-s", "0.2"]
    threads = max(1, cores // 2)  # every point: the threads of the largest worker count
    for run, workers in zip(sweep["runs"], (1, 2), strict=True):
        assert (run["workers"], run["status"], run["epochs_done"]) == (workers, "done", 2)
        assert run["oversubscribed"] is (workers * threads > cores)
        assert run["threads_per_worker"] == threads
        metrics = read_jsonl(out / run["run_dir"] / "metrics.jsonl")
        assert [(m["epoch"], m["world_size"]) for m in metrics] == [(1, workers), (2, workers)]
        assert run["epoch_time_s"] >= 0.2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_trainer_on_two_simulated_nodes(tiny_store: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = invoke(
        "cluster", "launch", str(REPO_CLUSTER_JSON),
        "--", "train", tiny_store, "--out", str(run), "--epochs", "1",
        "--model", "small_unet", "--batch-size", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (metrics,) = read_jsonl(run / "metrics.jsonl")
    assert (metrics["epoch"], metrics["world_size"], metrics["nodes"]) == (1, 2, 2)
    assert metrics["threads_per_worker"] == max(1, local_cpu_count() // 2)
    assert (run / "model.pt").is_file() and (run / "checkpoints" / "last.pt").is_file()


# -- checks before any worker starts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "notanint"],
         "training arguments: Invalid value for '--epochs': 'notanint' is not a valid integer."),
        (["--epochs", "0"], "--epochs 0 must be >= 1"),
        (["--compresion", "fp16"],
         "training arguments: No such option '--compresion'. Did you mean '--compression'?"),
        (["--resume", "--overwrite"], "--resume and --overwrite exclude each other; pick one"),
    ],
)  # fmt: skip
def test_plan_and_launch_parse_training_args_as_train_does(
    tmp_path: Path, args: list[str], message: str
) -> None:
    for command in ("plan", "launch"):
        result = invoke(
            "cluster", command, str(REPO_CLUSTER_JSON),
            "--", "train", "chips.zarr", "--out", str(tmp_path / "run"), *args,
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert result.stderr == f"error: {message}\n"


@pytest.fixture()
def no_spawning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a torchrun agent fails the test: the parent must refuse first."""

    real_popen = subprocess.Popen

    def popen(command: Any, *args: Any, **kwargs: Any) -> Any:
        # Only torchrun agents count: importing torch itself runs `ldconfig -p`.
        if "torch.distributed.run" in map(str, command):
            raise AssertionError(f"a worker was started: {command}")
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(agents.subprocess, "Popen", popen)


LOCAL_LAUNCHES = {
    "train --nproc": lambda store, out, *extra: (
        "train", store, "--out", out, "--nproc", "2", "--epochs", "1", *extra,
    ),
    "cluster launch": lambda store, out, *extra: (
        "cluster", "launch", str(REPO_CLUSTER_JSON), "--", "train", store, "--out", out, *extra,
    ),
    "scale": lambda store, out, *extra: (
        "scale", store, "--workers", "1,2", "--epochs", "1", "--out", out, "--", *extra,
    ),
}  # fmt: skip


@pytest.mark.usefixtures("no_spawning")
@pytest.mark.parametrize("launch", LOCAL_LAUNCHES)
def test_local_launches_refuse_in_the_parent_what_workers_would(
    tiny_store: str, tmp_path: Path, launch: str
) -> None:
    out = str(tmp_path / "run")
    result = invoke(*LOCAL_LAUNCHES[launch](tiny_store, out, "--batch-size", "64"))
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "error: 69 train chips over 2 workers give 34 chips per worker, fewer than --batch-size "
        "64; use a smaller batch or fewer workers"
    )
    interrupted = incomplete_copy(tiny_store, tmp_path / "interrupted.zarr")
    result = invoke(*LOCAL_LAUNCHES[launch](interrupted, out))
    assert result.exit_code == 2, result.output
    assert result.stderr == incomplete_store_error(interrupted)
    assert not (tmp_path / "run" / "logs").exists()


def test_workers_read_the_storage_options_from_their_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LANDCOVER_STORAGE_OPTIONS", f'{{"account_key": "{ACCOUNT_KEY}"}}')
    ctx = worker_command.make_context("worker", ["s.zarr", "--out", "r"])
    assert ctx.params["storage_options"] == {"account_key": ACCOUNT_KEY}


def test_scale_gives_storage_options_to_workers_as_environment(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[Job] = []

    def launch(plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
        jobs.append(plan.job)
        raise LaunchError("stopped by the test")

    monkeypatch.setattr(sweep, "launch_plan", launch)
    storage = f'{{"account_name": "acct", "account_key": "{ACCOUNT_KEY}"}}'
    result = invoke(
        "scale", tiny_store, "--workers", "1", "--epochs", "1", "--out", str(tmp_path / "s"),
        "--", "--batch-size", "8", "--storage-options", storage,
    )  # fmt: skip
    assert result.exit_code == 2
    (job,) = jobs
    threads = str(local_cpu_count())
    assert job.argv == (
        "${{inputs.store}}", "--out", "${{outputs.run}}", "--epochs", "1", "--batch-size", "8",
        "--threads", threads,
    )  # fmt: skip
    assert json.loads(job.secret_env["LANDCOVER_STORAGE_OPTIONS"])["account_key"] == ACCOUNT_KEY
    assert ACCOUNT_KEY not in result.output
    for path in (tmp_path / "s").rglob("*"):
        assert path.is_dir() or ACCOUNT_KEY not in path.read_text()


# -- failures inside workers, secrets, with the real trainer ----------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failure_inside_workers_is_one_line(tiny_store: str, tmp_path: Path) -> None:
    """Only the workers can see it: a shard object that does not decode. One line with the
    first failing rank's error and where the logs are; no traceback; exit code 2."""
    broken = tmp_path / "broken.zarr"
    shutil.copytree(tiny_store, broken)
    (broken / "images" / "c" / "5" / "0" / "0" / "0").write_bytes(b"not a shard" * 500)
    run = tmp_path / "run"
    result = invoke(
        "train", str(broken), "--out", str(run), "--nproc", "2", "--epochs", "1",
        "--batch-size", "8",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "error" in ln.lower()]
    assert line.startswith(f"error: {broken}: ")
    assert line.endswith(f" (worker logs: {run / 'logs'}/)")
    assert "Traceback" in (run / "logs" / "node-0.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_nproc_keeps_the_account_key_out_of_argv_logs_and_files(
    tiny_store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started: list[tuple[list[str], dict[str, str]]] = []
    real_popen = subprocess.Popen

    def popen(command: list[str], **kwargs: Any) -> Any:
        started.append((list(command), dict(kwargs.get("env") or {})))
        return real_popen(command, **kwargs)

    monkeypatch.setattr(agents.subprocess, "Popen", popen)
    # The local store stands in for a remote one: the parent's refusal of storage options
    # for local paths only (tests/landcover/test_options.py) is lifted so that they reach
    # the workers.
    monkeypatch.setattr("tiling.runtime.urls.check_storage_options", lambda urls, options: None)
    caplog.set_level(logging.DEBUG)
    run = tmp_path / "run"
    storage = f'{{"account_name": "acct", "account_key": "{ACCOUNT_KEY}"}}'
    result = invoke(
        "-v", "train", tiny_store, "--out", str(run), "--nproc", "2", "--epochs", "1",
        "--batch-size", "8", "--storage-options", storage,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ((command, env),) = started
    assert not any(ACCOUNT_KEY in arg for arg in command)
    assert ACCOUNT_KEY in env["LANDCOVER_STORAGE_OPTIONS"]
    assert ACCOUNT_KEY not in result.output and ACCOUNT_KEY not in caplog.text
    for path in run.rglob("*"):
        assert path.is_dir() or ACCOUNT_KEY.encode() not in path.read_bytes(), path
    # the workers got the options (run.json keeps them, the key redacted)
    config = json.loads((run / "run.json").read_text())["config"]
    assert config["storage_options"] == {"account_name": "acct", "account_key": "<redacted>"}


# -- the training arguments after `--` --------------------------------------------------------


def test_train_args_are_parsed_by_the_train_command() -> None:
    config, extra = train_config(
        ["train", "chips.zarr", "--epochs", "3", "--out=runs/a", "--resume"]
    )
    assert (config.store_url, config.out_dir, config.epochs, config.resume, extra) == (
        "chips.zarr", "runs/a", 3, True, (),
    )  # fmt: skip
    # no `train` word, store from cluster.json's data.url
    config, _ = train_config(["--out", "r", "--model", "x"], default_store="az://c/chips.zarr")
    assert (config.store_url, config.out_dir, config.model) == ("az://c/chips.zarr", "r", "x")
    # as `landcover train` parses them: an option given twice, the later value
    assert train_config(["train", "s", "--out", "a", "--out", "b"])[0].out_dir == "b"


def test_a_flag_name_given_as_a_value_is_a_value() -> None:
    """The arguments are parsed, not scanned: `--nproc` as --tracking's value is that value
    (refused by --tracking's own check), not the --nproc option."""
    with pytest.raises(TrainingError, match="--tracking '--nproc': '--nproc' is no tracking"):
        train_config(["train", "s", "--out", "a", "--tracking", "--nproc"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--out", "r"], "no chip store: give it after `train`"),
        (["train", "s"], "the training arguments need --out RUN_DIR"),
        (["train", "s", "--out"], "training arguments: Option '--out' requires an argument"),
        (["train", "s", "--out", "a", "--nproc", "2"], "--nproc is for `landcover train`"),
        (["train", "s", "--out", "a", "--nproc=1"], "--nproc is for `landcover train`"),
        (["train", "s", "--out", "a", "--bogus"], "training arguments: No such option"),
    ],
)
def test_bad_train_args(args: list[str], message: str) -> None:
    with pytest.raises(TrainingError, match=message.replace("(", r"\(")):
        train_config(args)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cluster_launch_trains_across_two_slurm_nodes(
    slurm_testbed: SlurmTestbed, tiny_store: str, tmp_path: Path
) -> None:
    """The engines issue's acceptance: `landcover cluster launch slurm.json -- train ...` with
    targetNodeCount 2 trains at world size 2, one rank on each SLURM node."""
    cluster_json, env = two_node_slurm_job(slurm_testbed, tmp_path)
    run = tmp_path / "run"
    result = CliRunner(env=env).invoke(
        main,
        ["cluster", "launch", str(cluster_json), "--wait", "--", "train", tiny_store,
         "--out", str(run), "--epochs", "1", "--batch-size", "8", "--threads", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    info = json.loads((run / "run.json").read_text())
    assert (info["world_size"], info["nodes"]) == (2, 2)
    assert [(r["rank"], r["node"]) for r in info["ranks"]] == [(0, "n0"), (1, "n1")]
    (epoch,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (epoch["world_size"], epoch["nodes"]) == (2, 2) and epoch["val_miou"] >= 0


SLURM_SPEC: dict[str, Any] = {"engine": "slurm", "targetNodeCount": 2}
_ENGINE_SPECS = {"slurm": SLURM_SPEC, "azureml": AZUREML_SPEC, "kubernetes": KUBERNETES_SPEC}


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`base` with `change` merged in, section by section."""
    out: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


# (engine, what cluster.json changes, the start of the one line that refuses it): values the
# engine's API server, SDK or sbatch would refuse, caught when cluster.json is read
PLAN_VALUES_AN_ENGINE_REJECTS: list[tuple[str, dict[str, Any], str]] = [
    # names
    ("kubernetes", {"kubernetes": {"namespace": "Bad_NS"}},
     "kubernetes.namespace 'Bad_NS' is not a Kubernetes name: use lower-case letters"),
    ("kubernetes", {"kubernetes": {"namespace": "n" * 64}},
     "kubernetes.namespace 'nnnn"),
    ("kubernetes", {"kubernetes": {"storageSecret": "Chips_Storage"}},
     "kubernetes.storageSecret 'Chips_Storage' is not a Kubernetes name"),
    ("kubernetes", {"kubernetes": {"runtime": "torch distributed"}},
     "kubernetes.runtime 'torch distributed' is not a Kubernetes name"),
    ("kubernetes", {"kubernetes": {"image": "my image:1"}},
     "kubernetes.image 'my image:1' is not an image reference"),
    ("azureml", {"azureml": {"experimentName": "my experiment"}},
     "azureml.experimentName 'my experiment' must be 1-255 letters, digits"),
    ("azureml", {"azureml": {"computeName": "9gpus"}},
     "azureml.computeName '9gpus' must be 2-16 letters"),
    ("slurm", {"name": "my job"}, "name 'my job' must be 2-40 letters"),
    ("slurm", {"slurm": {"partition": "gpu;rm"}}, "slurm.partition: must be a SLURM partition"),
    # quoting sbatch refuses
    ("slurm", {"slurm": {"extraDirectives": ['--comment="no end']}},
     "slurm.extraDirectives[0] '--comment=\"no end' has an unmatched quote"),
    # quantities
    ("kubernetes", {"kubernetes": {"cpu": "-4"}}, "kubernetes.cpu '-4' must be positive"),
    ("kubernetes", {"kubernetes": {"cpu": -4}}, "kubernetes.cpu '-4' must be positive"),
    ("kubernetes", {"kubernetes": {"cpu": "0"}}, "kubernetes.cpu '0' must be positive"),
    ("kubernetes", {"kubernetes": {"memory": "lots"}},
     "kubernetes.memory 'lots' is not a Kubernetes quantity"),
    ("kubernetes", {"kubernetes": {"memory": "16GB"}},
     "kubernetes.memory '16GB' is not a Kubernetes quantity"),
    ("kubernetes", {"kubernetes": {"memory": "128m"}},
     "kubernetes.memory '128m' is 0.128 bytes ('m' is milli): write 128Mi or 128M"),
    ("kubernetes", {"targetNodeCount": 0}, "targetNodeCount must be >= 1, got 0"),
    ("kubernetes", {"processesPerNode": 8}, "processesPerNode 8 exceeds the 2 GPU(s)"),
    ("azureml", {"properties": {"scaleSettings": {"manual": {"targetNodeCount": 0}}}},
     "properties.scaleSettings.manual.targetNodeCount must be >= 1, got 0"),
    ("azureml", {"azureml": {"idleSecondsBeforeScaleDown": -1}},
     "azureml.idleSecondsBeforeScaleDown must be >= 0"),
    ("slurm", {"slurm": {"cpusPerTask": 0}}, "slurm.cpusPerTask must be >= 1, got 0"),
    ("slurm", {"slurm": {"gpusPerNode": -1}}, "slurm.gpusPerNode must be >= 0, got -1"),
    ("slurm", {"processesPerNode": 0}, 'processesPerNode must be "auto" or a whole number >= 1'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "change", "message"),
    PLAN_VALUES_AN_ENGINE_REJECTS,
    ids=[f"{e}-{next(iter(c))}-{i}" for i, (e, c, _) in enumerate(PLAN_VALUES_AN_ENGINE_REJECTS)],
)
def test_plan_values_an_engine_would_reject_are_one_line_before_any_plan(
    tmp_path: Path, engine: str, change: dict[str, Any], message: str
) -> None:
    document = _merged(_ENGINE_SPECS[engine], change)
    if "properties" in change:  # the legacy form: its own section, merged one level deeper
        document["properties"] = {**_ENGINE_SPECS[engine]["properties"], **change["properties"]}
    spec = write_json(tmp_path / "c.json", document)
    result = invoke(
        "cluster", "plan", str(spec), "--out", str(tmp_path / "plan"),
        "--", "train", "chips.zarr", "--out", "/shared/run",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {spec}: {message}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "plan").exists()


def test_a_run_dir_an_sbatch_script_cannot_carry_is_one_line(tmp_path: Path) -> None:
    spec = write_json(tmp_path / "c.json", SLURM_SPEC)
    result = invoke(
        "cluster", "plan", str(spec), "--out", str(tmp_path / "plan"),
        "--", "train", "chips.zarr", "--out", "/shared/run\nrm -rf ~",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: log directory '/shared/run\\nrm -rf ~/logs' holds '\\n', which an sbatch script "
        "cannot carry (a line break ends an #SBATCH line): choose an output path without it\n"
    )
    assert not (tmp_path / "plan").exists()
