"""Kubernetes: the PyTorchJob has the structure Kubeflow's training operator requires, and
launch goes through kubectl (or says how without it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job, write_plan_files
from cluster.errors import EngineUnavailableError, LaunchError
from cluster.kubernetes import KubernetesPlan
from cluster.spec import ClusterSpec
from tests.cluster.fake_worker import fake_job

CONNECTION_STRING = (
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=S2V5Rm9yS3ViZXJuZXRlcw==;"
    "EndpointSuffix=core.windows.net"
)
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def k8s_spec(**overrides: Any) -> ClusterSpec:
    document: dict[str, Any] = {
        "name": "Landcover-NC24",
        "engine": "kubernetes",
        "vmSize": "Standard_NC24s_v3",
        "targetNodeCount": 3,
        "kubernetes": {
            "namespace": "training",
            "image": "myregistry.azurecr.io/landcover:1",
            "storageSecret": "chips-storage",
            "memory": "64Gi",
        },
    }
    document.update(overrides)
    return parse_cluster_spec(document)


def plan_of(spec: ClusterSpec, *args: str) -> KubernetesPlan:
    plan = plan_job(spec, fake_job("az://chips/naip.zarr", "/shared/runs/a", *args))
    assert isinstance(plan, KubernetesPlan)
    return plan


def assert_kubeflow_accepts(manifest: dict[str, Any]) -> None:
    """The training operator's admission rules (pytorchjob_webhook.go, ValidateReplicaSpecs)."""
    assert manifest["apiVersion"] == "kubeflow.org/v1"
    assert manifest["kind"] == "PyTorchJob"
    name = manifest["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 63
    spec = manifest["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas and set(replicas) <= {"Master", "Worker"}
    if "Master" in replicas:
        assert replicas["Master"]["replicas"] == 1
    if "Worker" in replicas:
        assert replicas["Worker"]["replicas"] >= 1
    if "elasticPolicy" in spec:
        assert "Worker" in replicas  # required with an elastic policy
        assert "nProcPerNode" not in spec["elasticPolicy"]  # deprecated field
    for role in replicas.values():
        assert role["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        containers = role["template"]["spec"]["containers"]
        assert containers and all(c.get("image") for c in containers)
        assert any(c["name"] == "pytorch" for c in containers)


def test_manifest_has_the_structure_kubeflow_requires() -> None:
    plan = plan_of(k8s_spec(elastic={"minNodes": 2, "maxNodes": 4, "maxRestarts": 2}))
    manifest = yaml.safe_load(plan.files()["pytorchjob.yaml"])
    assert_kubeflow_accepts(manifest)
    assert manifest["metadata"] == {
        "name": "landcover-nc24",
        "namespace": "training",
        "labels": {"app.kubernetes.io/name": "landcover", "landcover/workers": "12"},
    }
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert manifest["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 2,
    }
    pod = replicas["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": 4},
        "requests": {"memory": "64Gi"},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "chips-storage"}}]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "Standard_NC24s_v3"}
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert "python -m torch.distributed.run" in command[2]
    assert command[2].endswith(
        "--nproc-per-node 4 --max-restarts 2 -m tests.cluster.fake_worker az://chips/naip.zarr "
        "--out /shared/runs/a"
    )
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["OMP_NUM_THREADS"] == "6"


def test_small_and_cpu_jobs() -> None:
    single = yaml.safe_load(plan_of(k8s_spec(targetNodeCount=1)).files()["pytorchjob.yaml"])
    assert_kubeflow_accepts(single)
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert "elasticPolicy" not in single["spec"]
    assert single["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "Never"
    elastic_one = plan_of(k8s_spec(targetNodeCount=1, elastic={"maxRestarts": 1})).manifest
    assert list(elastic_one["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    cpu = plan_of(k8s_spec(vmSize="Standard_D16s_v3")).manifest
    container = cpu["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert "limits" not in container["resources"]  # no GPU asked of a CPU size


def test_secrets_are_redacted_in_the_plan_but_applied_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_of(
        k8s_spec(), "--storage-options", f'{{"connection_string": "{CONNECTION_STRING}"}}'
    )
    written = write_plan_files(plan, tmp_path / "plan")
    for text in [plan.describe(), *(p.read_text() for p in written)]:
        assert "S2V5Rm9yS3ViZXJuZXRlcw==" not in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    applied = tmp_path / "applied.yaml"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\ncat > {applied}\necho "pytorchjob created"\n')
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = launch_plan(plan, LaunchOptions())
    assert (result.status, result.job_id) == ("submitted", "training/landcover-nc24")
    assert "S2V5Rm9yS3ViZXJuZXRlcw==" in applied.read_text()  # what runs keeps the real value
    assert yaml.safe_load(applied.read_text())["kind"] == "PyTorchJob"
    assert "&id" not in applied.read_text()  # plain YAML, no anchors for kubectl to expand


def test_launch_without_kubectl_or_with_a_failing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_of(k8s_spec())
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineUnavailableError, match=r"kubectl not found on PATH: install it"):
        launch_plan(plan, LaunchOptions())
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(
        "#!/bin/sh\necho 'error: the server could not find the requested resource' >&2\nexit 1\n"
    )
    kubectl.chmod(0o755)
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions())
    assert str(info.value) == (
        "kubectl apply failed: error: the server could not find the requested resource"
    )
