"""A Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1), the default Kubernetes API.

The job names its runtime (`runtimeRef`: the `torch-distributed` ClusterTrainingRuntime unless
`kubernetes.runtime` / `runtimeKind` say otherwise) and overrides only what is ours:
`trainer.image`, `numNodes` (targetNodeCount), `numProcPerNode` (processesPerNode),
`resourcesPerNode` (a GPU per process, the requested CPU and memory), the command and the
environment. The runtime's Torch plugin gives each node PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK and PET_MASTER_ADDR/PORT, which `torchrun` reads itself, so the command names
only restarts and the worker module.

What Trainer v2 does not take in `trainer` goes in one `runtimePatches` entry (Trainer v2.2+;
v2.1 called them podTemplateOverrides) for the runtime's `node` job and container: the
/dev/shm volume and its mount, the VM size's nodeSelector and the GPU toleration. The webhook
refuses env on the `node` container there, so env stays in `trainer.env`.

Trainer v2 has no elastic node range: `elastic` runs `targetNodeCount` nodes and lets torchrun
restart the worker group up to `maxRestarts` times.
"""

from __future__ import annotations

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
    storage_secret_env,
    torchrun_args,
    worker_env,
)
from cluster.kubernetes.section import KubernetesSpec
from cluster.spec import ClusterSpec

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
NODE = "node"  # the runtime's trainer job and container (Trainer's constants.Node)
# runtimePatches entries are keyed by their manager, a domain-prefixed path (webhook rule)
PATCH_MANAGER = "landcover/cluster-plan"


def build_trainjob(
    spec: ClusterSpec, k8s: KubernetesSpec, job: Job
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The TrainJob manifest (real values) and the notes its plan shows."""
    notes = list(spec.notes)
    env = worker_env(spec, job)
    env += storage_secret_env(k8s, {e["name"] for e in env})
    trainer: dict[str, Any] = {
        "image": k8s.image,
        "command": ["python", "-m", "torch.distributed.run"],
        "args": torchrun_args(spec, job),
        "env": env,
        "numNodes": spec.node_count,
        "numProcPerNode": spec.processes_per_node,
    }
    pod_resources = resources(spec, k8s, notes)
    if pod_resources:
        trainer["resourcesPerNode"] = pod_resources
    pod_patch: dict[str, Any] = {
        "volumes": [shm_volume()],
        "containers": [{"name": NODE, "volumeMounts": [shm_mount()]}],
        **placement(spec),
    }
    node_patch = {"name": NODE, "template": {"spec": {"template": {"spec": pod_patch}}}}
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job_name(spec), "namespace": k8s.namespace, "labels": labels(spec)},
        "spec": {
            "runtimeRef": {"name": k8s.runtime, "apiGroup": API_GROUP, "kind": k8s.runtime_kind},
            "trainer": trainer,
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_patch]}}},
                }
            ],
        },
    }
    if spec.elastic is not None and spec.elastic.min_nodes != spec.elastic.max_nodes:
        notes.append(
            f"elastic {spec.elastic.min_nodes}..{spec.elastic.max_nodes} nodes: a TrainJob runs "
            f"a fixed {spec.node_count} node(s); torchrun restarts the group up to "
            f"{spec.max_restarts} times (use api pytorchjob for an elastic node range)"
        )
    if k8s.image_pull_policy is not None:
        notes.append(
            "imagePullPolicy is not a TrainJob field: set it in the runtime "
            f"{k8s.runtime_kind} {k8s.runtime}"
        )
    return manifest, tuple(notes + pod_notes(spec, job))
