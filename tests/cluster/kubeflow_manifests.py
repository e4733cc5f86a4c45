"""Shared by the Kubernetes engine tests: a kubernetes cluster spec, its plan for the fake
worker, and what Kubeflow accepts (the CRD schema plus the rules it states in CEL or that
the admission webhooks add)."""

from __future__ import annotations

import json
import re
from typing import Any

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import plan_job
from cluster.kubernetes.engine import KubernetesPlan
from cluster.spec import ClusterSpec
from tests.cluster.crd_schema import PYTORCHJOB_CRD, TRAINJOB_CRD, crd_errors
from tests.cluster.fake_worker import fake_job

ACCOUNT_KEY = "S2V5Rm9yS3ViZXJuZXRlcw=="
STORAGE_OPTIONS = json.dumps({"account_name": "acct", "account_key": ACCOUNT_KEY})
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Trainer v2's Torch plugin sets these itself and its webhook refuses them in trainer.env
TORCHRUN_RESERVED = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}


def k8s_spec(api: str | None = None, **overrides: Any) -> ClusterSpec:
    section: dict[str, Any] = {
        "namespace": "training",
        "image": "myregistry.azurecr.io/landcover:1",
        "storageSecret": "chips-storage",
        "memory": "64Gi",
    }
    if api is not None:
        section["api"] = api
    document: dict[str, Any] = {
        "name": "Landcover-NC24",
        "engine": "kubernetes",
        "vmSize": "Standard_NC24s_v3",
        "targetNodeCount": 3,
        "kubernetes": section,
    }
    document.update(overrides)
    return parse_cluster_spec(document)


def plan_of(spec: ClusterSpec, *args: str, secret: bool = False) -> KubernetesPlan:
    env = {"LANDCOVER_STORAGE_OPTIONS": STORAGE_OPTIONS} if secret else None
    job = fake_job("az://chips/naip.zarr", "/shared/runs/a", *args, secret_env=env)
    plan = plan_job(spec, job)
    assert isinstance(plan, KubernetesPlan)
    return plan


def assert_kubeflow_accepts(manifest: dict[str, Any]) -> None:
    """The CRD's schema, field by field, then the rules it states in CEL or that the
    admission webhooks add (trainjob_types.go, jobset.go and torch.go of Trainer v2.3;
    pytorchjob_webhook.go of the training operator)."""
    crd = TRAINJOB_CRD if manifest["kind"] == "TrainJob" else PYTORCHJOB_CRD
    assert crd_errors(crd, manifest) == []
    name = manifest["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 63
    spec = manifest["spec"]
    if manifest["kind"] == "TrainJob":
        assert not TORCHRUN_RESERVED & {e["name"] for e in spec["trainer"]["env"]}
        for patch in spec.get("runtimePatches", []):
            domain, _, rest = patch["manager"].partition("/")
            assert DNS1035.match(domain) and rest  # a domain-prefixed path
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                assert job["name"] == "node"  # the torch-distributed runtime's only job
                pod = job["template"]["spec"]["template"]["spec"]
                for container in pod.get("containers", []):
                    assert container["name"] == "node" and "env" not in container
        return
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas and set(replicas) <= {"Master", "Worker"}
    if "Master" in replicas:
        assert replicas["Master"]["replicas"] == 1
    if "elasticPolicy" in spec:
        assert "Worker" in replicas  # required with an elastic policy
    for role in replicas.values():
        assert any(c["name"] == "pytorch" for c in role["template"]["spec"]["containers"])
