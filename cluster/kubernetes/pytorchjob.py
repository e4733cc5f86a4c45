"""A Kubeflow training-operator v1 `PyTorchJob` (kubeflow.org/v1): the legacy API, kept for
clusters that still run the training operator (`"kubernetes": {"api": "pytorchjob"}`).

Replica specs follow the operator's rules: `Master` (exactly 1 replica) plus `Worker`
(targetNodeCount - 1) — with `elastic`, a `Worker` spec is required, so a 1-node elastic job is
one Worker. Each pod's container is named `pytorch` (the operator looks for that name), runs
`torchrun` (configured by the operator's PET_* / MASTER_* environment, with shell fallbacks for
older operators) and asks for `nvidia.com/gpu` when the VM size has GPUs. With `elastic` the
job gets `elasticPolicy` (rdzvBackend c10d, minReplicas/maxReplicas = elastic min/max nodes,
maxRestarts); the pods of a restarted group run the same arguments again.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from cluster.engine import Job
from cluster.kubernetes.pod import (
    job_name,
    labels,
    placement,
    pod_notes,
    resources,
    shm_mount,
    shm_volume,
    torchrun_args,
    worker_env,
)
from cluster.kubernetes.section import KubernetesSpec
from cluster.spec import ClusterSpec

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"  # the training operator finds the training container by this name
PORT_NAME = "pytorchjob-port"
PORT = 23456


def build_pytorchjob(
    spec: ClusterSpec, k8s: KubernetesSpec, job: Job
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The PyTorchJob manifest (real values) and the notes its plan shows."""
    notes = list(spec.notes)
    # torchrun reads PET_* (newer operators set PET_NNODES, PET_NODE_RANK, PET_MASTER_*, and
    # with elasticPolicy PET_RDZV_*); older operators set only WORLD_SIZE (= pods), RANK
    # (= pod index) and MASTER_ADDR/PORT, hence the fallbacks
    torchrun = (
        "exec python -m torch.distributed.run"
        ' --nnodes "${PET_NNODES:-$WORLD_SIZE}"'
        ' --node-rank "${PET_NODE_RANK:-$RANK}"'
        ' --master-addr "${PET_MASTER_ADDR:-$MASTER_ADDR}"'
        ' --master-port "${PET_MASTER_PORT:-$MASTER_PORT}"'
        f" --nproc-per-node {spec.processes_per_node}"
        f" {shlex.join(torchrun_args(spec, job))}"
    )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": k8s.image,
        "imagePullPolicy": k8s.image_pull_policy or "IfNotPresent",
        "command": ["/bin/sh", "-c", torchrun],
        "env": worker_env(spec, job),
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        "volumeMounts": [shm_mount()],
    }
    if k8s.storage_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.storage_secret}}]
    if k8s.storage_secret_keys is not None:
        notes.append("kubernetes.storageSecretKeys is for TrainJob: a PyTorchJob reads all keys")
    pod_resources = resources(spec, k8s, notes)
    if pod_resources:
        container["resources"] = pod_resources
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": [shm_volume()]}
    pod_spec.update(placement(spec))
    restart_policy = "OnFailure" if spec.max_restarts > 0 else "Never"

    def replica(count: int) -> dict[str, Any]:
        # a copy each: a shared dict would come out of yaml.safe_dump as anchors and aliases
        return {
            "replicas": count,
            "restartPolicy": restart_policy,
            "template": {"spec": copy.deepcopy(pod_spec)},
        }

    replicas: dict[str, Any] = {}
    if spec.elastic is not None and spec.node_count == 1:
        replicas["Worker"] = replica(1)  # elastic jobs must have a Worker spec
    else:
        replicas["Master"] = replica(1)
        if spec.node_count > 1:
            replicas["Worker"] = replica(spec.node_count - 1)
    job_spec: dict[str, Any] = {
        "runPolicy": {"cleanPodPolicy": "None"},  # keep finished pods: their logs
        "pytorchReplicaSpecs": replicas,
    }
    if spec.elastic is not None:
        job_spec["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "minReplicas": spec.elastic.min_nodes,
            "maxReplicas": spec.elastic.max_nodes,
            "maxRestarts": spec.elastic.max_restarts,
        }
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job_name(spec), "namespace": k8s.namespace, "labels": labels(spec)},
        "spec": job_spec,
    }
    return manifest, tuple(notes + pod_notes(spec, job))
