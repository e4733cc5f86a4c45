"""The Kubeflow Trainer v2 TrainJob: the default, valid field by field against Kubeflow's CRD,
and the validator refuses what the API server would."""

from __future__ import annotations

import copy
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.cluster.crd_schema import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_errors
from tests.cluster.kubeflow_manifests import (
    assert_kubeflow_accepts,
    k8s_spec,
    plan_of,
)


def test_trainjob_is_the_default_and_matches_the_crd() -> None:
    plan = plan_of(k8s_spec(elastic={"minNodes": 2, "maxNodes": 4, "maxRestarts": 2}))
    manifest = yaml.safe_load(plan.files()["trainjob.yaml"])
    assert_kubeflow_accepts(manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == (
        "trainer.kubeflow.org/v1alpha1",
        "TrainJob",
    )
    assert manifest["metadata"] == {
        "name": "landcover-nc24",
        "namespace": "training",
        "labels": {"app.kubernetes.io/name": "landcover", "landcover/workers": "12"},
    }
    spec = manifest["spec"]
    assert spec["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 4)
    assert trainer["image"] == "myregistry.azurecr.io/landcover:1"
    assert trainer["resourcesPerNode"] == {
        "limits": {"nvidia.com/gpu": 4},
        "requests": {"memory": "64Gi"},
    }
    # torchrun takes the node shape from the runtime's PET_* variables
    assert trainer["command"] == ["python", "-m", "torch.distributed.run"]
    assert trainer["args"] == [
        "--max-restarts", "2", "-m", "tests.cluster.fake_worker",
        "az://chips/naip.zarr", "--out", "/shared/runs/a",
    ]  # fmt: skip
    env = {e["name"]: e for e in trainer["env"]}
    assert env["OMP_NUM_THREADS"]["value"] == "6"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert env["AZURE_STORAGE_ACCOUNT_KEY"]["valueFrom"] == {
        "secretKeyRef": {
            "name": "chips-storage",
            "key": "AZURE_STORAGE_ACCOUNT_KEY",
            "optional": True,
        }
    }
    (patch,) = spec["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert pod["containers"] == [
        {"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    ]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "Standard_NC24s_v3"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    text = plan.describe()
    assert text.startswith("engine: kubernetes (Kubeflow Trainer v2 TrainJob, ")
    assert "3 node(s) on ClusterTrainingRuntime torch-distributed" in text
    assert "note: elastic 2..4 nodes: a TrainJob runs a fixed 3 node(s)" in text


def test_the_validator_finds_what_kubeflow_would_refuse() -> None:
    """Each mistake is one the API server would reject; the validator names the field."""
    good = copy.deepcopy(dict(plan_of(k8s_spec()).manifest))
    trainer_cases: list[tuple[str, Any, str]] = [
        ("numProcsPerNode", 4, "spec.trainer.numProcsPerNode: unknown field"),
        ("numNodes", "3", "spec.trainer.numNodes: must be of type integer, got '3'"),
        ("numNodes", 2**31, "spec.trainer.numNodes: 2147483648 is outside"),
        ("image", "x" * 501, "spec.trainer.image: longer than 500 characters"),
        ("args", ["a"] * 129, "spec.trainer.args: more than 128 items"),
    ]
    for key, value, expected in trainer_cases:
        bad = copy.deepcopy(good)
        bad["spec"]["trainer"][key] = value
        assert any(e.startswith(expected) for e in crd_errors(TRAINJOB_CRD, bad)), key
    bad = copy.deepcopy(good)
    bad["spec"]["trainer"]["env"].append({"name": "OMP_NUM_THREADS", "value": "1"})
    assert "spec.trainer.env: two items share the key name" in crd_errors(TRAINJOB_CRD, bad)
    bad = copy.deepcopy(good)
    del bad["spec"]["runtimeRef"]
    assert "spec.runtimeRef: required" in crd_errors(TRAINJOB_CRD, bad)
    bad = copy.deepcopy(good)
    bad["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "four"
    assert any("does not match" in e for e in crd_errors(TRAINJOB_CRD, bad))
    bad = copy.deepcopy(good)
    bad["status"] = {"conditions": [{"type": "Complete", "status": "Maybe"}]}
    assert (
        "status.conditions[0].status: must be one of ['True', 'False', 'Unknown'], got 'Maybe'"
        in crd_errors(TRAINJOB_CRD, bad)
    )
    v1 = copy.deepcopy(dict(plan_of(k8s_spec("pytorchjob")).manifest))
    v1["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "1"
    v1["spec"]["runPolicy"]["cleanPodPolicies"] = "None"
    assert crd_errors(PYTORCHJOB_CRD, v1) == [
        "spec.runPolicy.cleanPodPolicies: unknown field (not in the schema of spec.runPolicy)",
        "spec.pytorchReplicaSpecs.Master.replicas: must be of type integer, got '1'",
    ]
