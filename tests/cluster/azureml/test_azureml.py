"""Azure ML: the planned YAML loads with azure-ai-ml offline; launch fails fast without
credentials."""

from __future__ import annotations

import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.azureml import engine as azureml
from cluster.azureml.assets import (
    DEFAULT_BASE_IMAGE,
    TRACKING_REQUIREMENTS,
    input_path_for,
)
from cluster.azureml.engine import AzureMLEngine, AzureMLPlan, credential_sources
from cluster.clusterjson import parse_cluster_spec
from cluster.engine import Job, LaunchOptions, launch_plan, plan_job, write_plan_files
from cluster.errors import ClusterError, ClusterSpecError, EngineUnavailableError, LaunchError
from cluster.spec import ClusterSpec
from tests.cluster.fake_worker import fake_job

# azure-ai-ml's schemas still use marshmallow 3 idioms: hundreds of warnings that are not ours
pytestmark = pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")

REPO = Path(__file__).resolve().parents[3]  # the project the fake worker belongs to
SAS = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01&sig=U2VjcmV0U2lnbmF0dXJlMTIz"
ACCOUNT_KEY = "QWNjb3VudEtleUZvckF6dXJlTUxUZXN0cw=="


def aml_spec(**overrides: Any) -> ClusterSpec:
    document: dict[str, Any] = {
        "name": "landcover-nc6",
        "engine": "azureml",
        "vmSize": "Standard_NC24s_v3",
        "vmPriority": "lowpriority",
        "targetNodeCount": 2,
        "data": {"mode": "direct", "accountName": "landcoverdata"},
        "azureml": {
            "subscriptionId": "00000000-0000-0000-0000-000000000000",
            "resourceGroup": "rg",
            "workspace": "ws",
            "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest",
            "computeName": "gpu-cluster",
            "idleSecondsBeforeScaleDown": 600,
        },
        "mounts": [
            {
                "accountName": "landcoverdata",
                "containerName": "chips",
                "relativeMountPath": "bfs",
                "credentials": {"accountKey": ACCOUNT_KEY},
            }
        ],
    }
    document.update(overrides)
    return parse_cluster_spec(document)


WORKSPACE = {
    "subscriptionId": "00000000-0000-0000-0000-000000000000",
    "resourceGroup": "rg",
    "workspace": "ws",
    "computeName": "gpu-cluster",
}
ENVIRONMENT_FILES = {
    "environment.yaml",
    "environment/Dockerfile",
    "environment/requirements.txt",
    "environment/base_constraints.py",
}


def default_spec(**azureml: str) -> ClusterSpec:
    """An azureml spec without image or environment: the plan builds the environment."""
    return aml_spec(azureml={**WORKSPACE, **azureml})


def write_project(root: Path, project: dict[str, Any], build: list[str]) -> Path:
    """A pyproject.toml with this [project] table and [build-system] requires."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["[build-system]", f"requires = {build!r}", "", "[project]"]
    lines += [f"{key} = {value!r}" for key, value in project.items()]
    (root / "pyproject.toml").write_text("\n".join(lines).replace("'", '"') + "\n")
    return root


def requirement_lines(plan: AzureMLPlan) -> list[str]:
    text = plan.files()["environment/requirements.txt"]
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_default_plan_builds_an_environment_and_every_file_loads(tmp_path: Path) -> None:
    from azure.ai.ml import load_compute, load_environment, load_job

    secret_env = {"LANDCOVER_STORAGE_OPTIONS": f'{{"account_key": "{ACCOUNT_KEY}"}}'}
    job = fake_job("az://chips/naip.zarr", "runs/a", "--epochs", "2", secret_env=secret_env)
    plan = plan_job(default_spec(), job)
    assert isinstance(plan, AzureMLPlan)
    written = write_plan_files(plan, tmp_path)
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert names == {"plan.txt", "job.yaml", "compute.yaml", *ENVIRONMENT_FILES}

    loaded: Any = load_job(tmp_path / "job.yaml")
    # the project directory is uploaded, and installed before the entry module runs
    assert Path(loaded.code) == REPO
    assert loaded.command.startswith(
        "flock /tmp/landcover-install.lock python -m pip install --quiet --no-deps "
        "--no-build-isolation -e . && python -m tests.cluster.fake_worker ${{inputs.store}} "
    )
    # an anonymous environment built from the plan's context (Azure ML caches it by content)
    assert loaded.environment.image is None
    assert loaded.environment.path == tmp_path / "environment"
    environment: Any = load_environment(tmp_path / "environment.yaml")
    assert environment.name == "landcover" and len(environment.version) == 12
    assert environment.path == tmp_path / "environment" and environment.os_type == "linux"
    assert environment.tags["base_image"] == DEFAULT_BASE_IMAGE
    compute: Any = load_compute(tmp_path / "compute.yaml")
    assert compute.size == "Standard_NC24s_v3" and compute.max_instances == 2

    # requirements.txt is pyproject.toml's, read independently here, plus MLflow
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert requirement_lines(plan) == [
        *pyproject["project"]["dependencies"],
        *pyproject["build-system"]["requires"],
        *TRACKING_REQUIREMENTS,
    ]
    assert "azureml-mlflow" in requirement_lines(plan)
    dockerfile = (tmp_path / "environment" / "Dockerfile").read_text()
    assert f"\nFROM {DEFAULT_BASE_IMAGE}\n" in dockerfile
    # the base image's torch and torchvision are pinned while pip installs the rest
    assert "-r /tmp/landcover-environment/requirements.txt" in dockerfile
    assert "-c /tmp/landcover-environment/constraints.txt" in dockerfile

    for text in [plan.describe(), *(p.read_text() for p in written)]:
        assert ACCOUNT_KEY not in text
    assert "environment: built from pytorch/pytorch:" in plan.describe()
    assert f"code: {REPO} (uploaded" in plan.describe()

    # the loaders do check the build context: without it the job is refused
    for context_file in (tmp_path / "environment").iterdir():
        context_file.unlink()
    (tmp_path / "environment").rmdir()
    with pytest.raises(Exception, match="Can't find directory or file"):
        load_job(tmp_path / "job.yaml")


def test_base_constraints_pin_the_images_torch_and_check_its_python(tmp_path: Path) -> None:
    """The build-time script, run here with this interpreter as the base image's Python."""
    import importlib.metadata

    plan = plan_job(default_spec(), fake_job("az://chips/a.zarr", "r"))
    assert isinstance(plan, AzureMLPlan)
    script = tmp_path / "base_constraints.py"
    script.write_text(plan.files()["environment/base_constraints.py"])
    constraints = tmp_path / "constraints.txt"
    subprocess.run([sys.executable, str(script), str(constraints)], check=True)
    assert constraints.read_text().splitlines() == [
        f"torch=={importlib.metadata.version('torch')}",
        f"torchvision=={importlib.metadata.version('torchvision')}",
    ]

    project = write_project(
        tmp_path / "future",
        {"name": "future", "version": "1", "requires-python": ">=3.99", "dependencies": []},
        ["setuptools>=68"],
    )
    plan = plan_job(default_spec(code=str(project)), fake_job("az://chips/a.zarr", "r"))
    assert isinstance(plan, AzureMLPlan)
    script.write_text(plan.files()["environment/base_constraints.py"])
    result = subprocess.run(
        [sys.executable, str(script), str(constraints)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"future needs Python >=3.99, but {DEFAULT_BASE_IMAGE} has 3.")


def test_the_environment_follows_the_uploaded_projects_pyproject(tmp_path: Path) -> None:
    project = write_project(
        tmp_path / "demo",
        {
            "name": "demo",
            "version": "2.0",
            "requires-python": ">=3.12",
            "dependencies": ["numpy>=2", "Torch>=2.6", "pillow"],
        },
        ["hatchling>=1.20"],
    )
    spec = default_spec(code=str(project), baseImage="nvcr.io/nvidia/pytorch:25.01-py3")
    plan = plan_job(spec, fake_job("az://chips/a.zarr", "r"))
    assert isinstance(plan, AzureMLPlan)
    assert requirement_lines(plan) == [
        "numpy>=2",
        "Torch>=2.6",
        "pillow",
        "hatchling>=1.20",
        *TRACKING_REQUIREMENTS,
    ]
    files = plan.files()
    assert (
        "(Torch>=2.6 satisfied by the base image's own builds)"
        in files["environment/requirements.txt"]
    )
    assert "\nFROM nvcr.io/nvidia/pytorch:25.01-py3\n" in files["environment/Dockerfile"]
    assert "MINIMUM_PYTHON = (3, 12)" in files["environment/base_constraints.py"]
    assert plan.job_document["code"] == str(project)
    assert str(plan.job_document["command"]).startswith("flock /tmp/demo-install.lock ")
    version = yaml.safe_load(files["environment.yaml"])["version"]

    # a changed dependency is a new environment version (a registered one cannot change)
    write_project(project, {"name": "demo", "dependencies": ["numpy>=2.1"]}, ["hatchling"])
    again = plan_job(spec, fake_job("az://chips/a.zarr", "r"))
    assert isinstance(again, AzureMLPlan)
    assert yaml.safe_load(again.files()["environment.yaml"])["version"] != version


def test_a_project_the_plan_cannot_read_is_one_line(tmp_path: Path) -> None:
    job = fake_job("az://chips/a.zarr", "r")
    with pytest.raises(ClusterError, match=r"azureml.code .*: no pyproject.toml there"):
        plan_job(default_spec(code=str(tmp_path)), job)
    write_project(tmp_path, {"name": "x", "dynamic": ["dependencies"]}, [])
    with pytest.raises(ClusterError, match=r"dependencies are dynamic, so the plan cannot"):
        plan_job(default_spec(code=str(tmp_path)), job)
    orphan = Job("json.decoder")  # a module from no project directory
    with pytest.raises(ClusterError, match=r"no pyproject.toml beside the 'json' package"):
        plan_job(default_spec(), orphan)


def test_image_and_registered_environment_override_the_build(tmp_path: Path) -> None:
    from azure.ai.ml import load_job

    job = fake_job("az://chips/a.zarr", "r")
    registered = plan_job(default_spec(environment="landcover-env:3"), job)
    assert isinstance(registered, AzureMLPlan)
    assert set(registered.files()) == {"job.yaml", "compute.yaml"}
    write_plan_files(registered, tmp_path)
    loaded: Any = load_job(tmp_path / "job.yaml")
    assert loaded.environment == "landcover-env:3"  # the SDK drops "azureml:"
    assert Path(loaded.code) == REPO
    assert loaded.command.startswith("flock /tmp/landcover-install.lock python -m pip install")
    assert "environment: registered environment landcover-env:3" in registered.describe()

    image = plan_job(aml_spec(), job)  # an image with the project installed: as it was
    assert isinstance(image, AzureMLPlan)
    assert set(image.files()) == {"job.yaml", "compute.yaml"}
    assert image.job_document["environment"] == {
        "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"
    }
    assert "code" not in image.job_document
    assert str(image.job_document["command"]).startswith("python -m tests.cluster.fake_worker")


@pytest.mark.parametrize(
    ("azureml", "message"),
    [
        (
            {"image": "r.io/lc:1", "environment": "lc:1"},
            "azureml.image and azureml.environment both choose the job's environment: keep one",
        ),
        (
            {"environment": "lc:1", "baseImage": "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"},
            "azureml.environment and azureml.baseImage both choose the job's environment",
        ),
        (
            {"environment": "landcover-env"},
            "azureml.environment 'landcover-env' must name a registered environment as "
            '"name:version" or "name@latest"',
        ),
        ({"baseImage": " "}, 'azureml.baseImage is empty: give a value or drop "baseImage"'),
    ],
)
def test_environment_choices_are_checked(azureml: dict[str, str], message: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        default_spec(**azureml)
    assert str(info.value).startswith(f"cluster.json: {message}")


def test_planned_yaml_loads_with_azure_ai_ml(tmp_path: Path) -> None:
    from azure.ai.ml import load_compute, load_job

    spec = aml_spec(elastic={"maxRestarts": 1})
    job = fake_job(
        "az://chips/naip.zarr",
        "runs/a",
        "--epochs",
        "3",
        "--storage-options",
        f'{{"sas_token": "{SAS}"}}',
    )
    plan = plan_job(spec, job)
    assert isinstance(plan, AzureMLPlan)
    written = write_plan_files(plan, tmp_path)
    job_yaml, compute_yaml = tmp_path / "job.yaml", tmp_path / "compute.yaml"
    assert {p.name for p in written} == {"plan.txt", "job.yaml", "compute.yaml"}

    loaded: Any = load_job(job_yaml)  # a Command job
    assert loaded.type == "command"
    assert loaded.compute == "gpu-cluster"
    assert loaded.resources.instance_count == 2
    assert loaded.distribution.type == "pytorch"
    assert loaded.distribution.process_count_per_instance == 4  # 4 V100s per NC24s_v3
    store = loaded.inputs["store"]
    assert store.type == "uri_folder" and store.mode == "direct"
    assert store.path == "https://landcoverdata.blob.core.windows.net/chips/naip.zarr"
    assert loaded.outputs["run"].type == "uri_folder"
    command = loaded.command
    # Azure ML binds the references itself
    assert command.startswith(
        "python -m tests.cluster.fake_worker ${{inputs.store}} --out ${{outputs.run}} --epochs 3"
    )
    assert loaded.environment_variables == {"OMP_NUM_THREADS": "6"}  # 24 vCPUs / 4 processes

    compute: Any = load_compute(compute_yaml)  # an AmlCompute
    assert compute.type == "amlcompute"
    assert (compute.size, compute.min_instances, compute.max_instances) == (
        "Standard_NC24s_v3",
        0,
        2,
    )
    assert compute.idle_time_before_scale_down == 600
    assert compute.tier == "low_priority"

    # secrets: never in the printed plan nor in any written file; the plan itself keeps them
    for text in [plan.describe(), *(p.read_text() for p in written)]:
        assert "U2VjcmV0U2lnbmF0dXJlMTIz" not in text and ACCOUNT_KEY not in text
    assert "U2VjcmV0U2lnbmF0dXJlMTIz" in str(plan.job_document["command"])
    assert "elastic: Azure ML command jobs run on exactly" in plan.describe()


def test_a_broken_job_document_is_refused_by_the_sdk(tmp_path: Path) -> None:
    """The load check above can fail: the SDK rejects a document we get wrong."""
    from azure.ai.ml import load_job
    from azure.ai.ml.exceptions import ValidationException
    from marshmallow.exceptions import ValidationError

    plan = plan_job(aml_spec(), fake_job("az://chips/x.zarr", "r"))
    assert isinstance(plan, AzureMLPlan)
    document = yaml.safe_load(plan.files()["job.yaml"])
    document["distribution"]["processes_per_node"] = document["distribution"].pop(
        "process_count_per_instance"
    )
    broken = tmp_path / "job.yaml"
    broken.write_text(yaml.safe_dump(document))
    with pytest.raises((ValidationException, ValidationError)):
        load_job(broken)


def test_store_urls_become_azure_ml_inputs(tmp_path: Path) -> None:
    spec = aml_spec(data={"mode": "mount"})  # no accountName: found through the mount
    assert input_path_for("az://chips/a.zarr", spec) == (
        "https://landcoverdata.blob.core.windows.net/chips/a.zarr",
        None,
    )
    for passthrough in (
        "azureml://datastores/chips/paths/a.zarr",
        "https://acct.blob.core.windows.net/c/a.zarr",
        "abfss://c@acct.dfs.core.windows.net/a.zarr",
    ):
        assert input_path_for(passthrough, spec) == (passthrough, None)
    with pytest.raises(ClusterError, match="needs the storage account of container 'other'"):
        input_path_for("az://other/a.zarr", spec)
    with pytest.raises(ClusterError, match="Azure ML cannot read this URL"):
        input_path_for("memory://a.zarr", spec)
    path, note = input_path_for(str(tmp_path / "chips.zarr"), spec)
    assert path == str(tmp_path / "chips.zarr") and note and "uploaded at submit" in note
    plan = plan_job(spec, fake_job("az://chips/a.zarr", "azureml://datastores/runs/paths/a"))
    assert isinstance(plan, AzureMLPlan)
    assert plan.job_document["inputs"]["store"]["mode"] == "ro_mount"
    assert plan.job_document["outputs"]["run"]["path"] == "azureml://datastores/runs/paths/a"


@pytest.fixture()
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Azure environment, no CLIs on PATH, and a metadata service that refuses at once."""
    for name in (
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_CLIENT_CERTIFICATE_PATH",
        "AZURE_FEDERATED_TOKEN_FILE",
        "IDENTITY_ENDPOINT",
        "MSI_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(azureml, "IMDS_URL", "http://127.0.0.1:9/metadata/instance")


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_credentials")
def test_launch_without_credentials_fails_fast_and_clearly() -> None:
    assert credential_sources() == []
    plan = plan_job(aml_spec(), fake_job("az://chips/a.zarr", "r"))
    with pytest.raises(EngineUnavailableError) as info:
        launch_plan(plan, LaunchOptions())
    assert str(info.value) == (
        "no Azure credentials found: run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID "
        "and AZURE_CLIENT_SECRET for a service principal"
    )


def test_credential_sources_are_detected_without_network(tmp_path: Path) -> None:
    az = tmp_path / "az"
    az.write_text("#!/bin/sh\n")
    az.chmod(0o755)
    env = {
        "AZURE_CLIENT_ID": "id",
        "AZURE_TENANT_ID": "tenant",
        "AZURE_CLIENT_SECRET": "secret",
        "PATH": str(tmp_path),
    }
    assert credential_sources(env) == ["service principal (environment)", "Azure CLI"]


class _HangingCredential:
    def __init__(self, **kwargs: Any) -> None:
        self.release = threading.Event()

    def get_token(self, *scopes: str) -> Any:
        self.release.wait(30)


class _RefusingCredential:
    def __init__(self, **kwargs: Any) -> None:
        pass

    def get_token(self, *scopes: str) -> Any:
        raise RuntimeError("DefaultAzureCredential failed to retrieve a token\nmore lines")


@pytest.mark.timeout(60)
def test_a_credential_that_hangs_or_fails_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.identity

    monkeypatch.setenv("AZURE_CLIENT_ID", "id")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "secret")
    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", _HangingCredential)
    with pytest.raises(EngineUnavailableError, match=r"gave no token within 0.5 s: check"):
        azureml.check_credentials(timeout_s=0.5)
    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", _RefusingCredential)
    with pytest.raises(EngineUnavailableError) as info:
        azureml.check_credentials(timeout_s=5)
    assert str(info.value) == (
        "Azure credentials failed (DefaultAzureCredential failed to retrieve a token): run "
        "`az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET for a "
        "service principal"
    )


def test_engine_refuses_another_engines_plan() -> None:
    local_plan = plan_job(parse_cluster_spec({"targetNodeCount": 1}), fake_job("s", "r"))
    with pytest.raises(TypeError, match="cannot launch a local plan"):
        AzureMLEngine().launch(local_plan, LaunchOptions())


class _FakeJobs:
    """`MLClient.jobs`: one job, `job-1`, that ends with `status`; its output downloads as
    `named-outputs/<name>/metrics.jsonl`."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.streamed: list[str] = []

    def create_or_update(self, job: Any) -> Any:
        self.submitted = job
        build = getattr(job.environment, "build", None)
        if build is not None:  # what the job's build context held when it was submitted
            context = Path(job.environment.path)
            self.context = {f.name: f.read_text() for f in context.iterdir()}
        return SimpleNamespace(name="job-1", studio_url="https://ml.azure.com/runs/job-1")

    def stream(self, name: str) -> None:
        self.streamed.append(name)

    def get(self, name: str) -> Any:
        return SimpleNamespace(status=self.status)

    def download(self, name: str, *, download_path: str, output_name: str) -> None:
        named = Path(download_path) / "named-outputs" / output_name
        named.mkdir(parents=True)
        (named / "metrics.jsonl").write_text("{}\n")


def _fake_client(monkeypatch: pytest.MonkeyPatch, status: str) -> _FakeJobs:
    import azure.ai.ml

    jobs = _FakeJobs(status)
    compute = SimpleNamespace(begin_create_or_update=lambda c: SimpleNamespace(result=lambda: c))
    client = SimpleNamespace(jobs=jobs, compute=compute)
    monkeypatch.setattr(azure.ai.ml, "MLClient", lambda *args: client)
    monkeypatch.setattr(azureml, "check_credentials", lambda: object())
    return jobs


def test_submission_returns_at_once_or_waits_and_fetches_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    plan = plan_job(aml_spec(), fake_job("az://chips/a.zarr", str(out)))
    jobs = _fake_client(monkeypatch, "Completed")
    submitted = launch_plan(plan, LaunchOptions())
    assert (submitted.engine, submitted.job_id, submitted.status) == (
        "azureml",
        "job-1",
        "submitted",
    )
    assert submitted.run_dir is None and jobs.streamed == [] and not out.exists()
    assert submitted.url == submitted.log_location == "https://ml.azure.com/runs/job-1"

    done = launch_plan(plan, LaunchOptions(wait=True))
    assert (done.status, done.run_dir, jobs.streamed) == ("succeeded", str(out), ["job-1"])
    assert (out / "metrics.jsonl").read_text() == "{}\n"

    _fake_client(monkeypatch, "Failed")
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions(wait=True))
    assert (
        str(info.value) == "Azure ML job job-1 ended Failed; logs: https://ml.azure.com/runs/job-1"
    )


def test_submission_of_a_built_environment_sends_its_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = plan_job(default_spec(), fake_job("az://chips/a.zarr", str(tmp_path / "run")))
    jobs = _fake_client(monkeypatch, "Completed")
    assert launch_plan(plan, LaunchOptions()).status == "submitted"
    # the submitted job.yaml had the build context beside it, as `plan --out` writes it
    assert jobs.submitted.environment.build.path == "environment"
    assert jobs.context == {
        name.removeprefix("environment/"): text
        for name, text in plan.files().items()
        if name.startswith("environment/")
    }
    assert Path(jobs.submitted.code) == REPO


def test_the_default_base_image_holds_a_torch_that_pyproject_admits() -> None:
    # the image provides torch (BASE_IMAGE_PACKAGES): a tag below pyproject's floor would give
    # Azure ML jobs a torch whose weights_only loading can be bypassed
    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads(
        (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text(encoding="utf-8")
    )
    (torch_req,) = [
        r for r in map(Requirement, project["project"]["dependencies"]) if r.name == "torch"
    ]
    tag = DEFAULT_BASE_IMAGE.split(":", 1)[1]
    assert torch_req.specifier.contains(Version(tag.split("-", 1)[0])), DEFAULT_BASE_IMAGE
