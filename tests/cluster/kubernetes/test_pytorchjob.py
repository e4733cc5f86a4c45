"""The training-operator v1 PyTorchJob, on request: valid against Kubeflow's CRD and its
webhook's replica rules."""

from __future__ import annotations

import yaml  # type: ignore[import-untyped,unused-ignore]

from tests.cluster.kubeflow_manifests import (
    assert_kubeflow_accepts,
    k8s_spec,
    plan_of,
)


def test_pytorchjob_on_request_matches_the_crd() -> None:
    plan = plan_of(k8s_spec("pytorchjob", elastic={"minNodes": 2, "maxNodes": 4, "maxRestarts": 2}))
    manifest = yaml.safe_load(plan.files()["pytorchjob.yaml"])
    assert_kubeflow_accepts(manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
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
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "Standard_NC24s_v3"}
    command = container["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert command[2].endswith(
        "--nproc-per-node 4 --max-restarts 2 -m tests.cluster.fake_worker az://chips/naip.zarr "
        "--out /shared/runs/a"
    )
    assert plan.describe().startswith("engine: kubernetes (Kubeflow PyTorchJob, kubeflow.org/v1)")
