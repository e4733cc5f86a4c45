"""What every Kubeflow training pod gets, whichever job kind runs it: its environment, the
Secret that carries the job's secret environment, GPU and memory requests, node placement,
the /dev/shm volume, and the notes a plan shows about what a pod cannot do.

Secrets never appear in a job object: the job's `secret_env` (e.g. the storage options, account
key included) goes into a Secret of its own (`env_secret`) that the pods' environment
references key by key (`secretKeyRef`); plans show that Secret redacted.
"""

from __future__ import annotations

import re
from typing import Any

from cluster.engine import Job, threads_per_worker
from cluster.errors import ClusterError
from cluster.kubernetes.section import KubernetesSpec
from cluster.spec import ClusterSpec

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_MAX = 63

# What a pod can read from `kubernetes.storageSecret` when its keys are not listed: the
# variables adlfs reads, and landcover's storage options (landcover.options.STORAGE_OPTIONS_ENV;
# cluster does not import landcover)
STORAGE_SECRET_KEYS: tuple[str, ...] = (
    "LANDCOVER_STORAGE_OPTIONS",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
)

SHM_VOLUME = "dshm"
GPU_RESOURCE = "nvidia.com/gpu"


def job_name(spec: ClusterSpec) -> str:
    """The job's name: the spec name as a DNS-1035 label (both Kubeflow APIs' rule)."""
    name = spec.name.lower()
    if not _DNS1035.match(name) or len(name) > _DNS1035_MAX:
        raise ClusterError(
            f"name {spec.name!r} cannot name a Kubeflow job: use a-z, 0-9 and '-', "
            f"at most {_DNS1035_MAX} characters"
        )
    return name


def labels(spec: ClusterSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "landcover", "landcover/workers": str(spec.workers)}


def env_secret_name(name: str) -> str:
    return f"{name}-env"


def env_secret(spec: ClusterSpec, k8s: KubernetesSpec, job: Job) -> dict[str, Any] | None:
    """The Secret holding the job's secret environment (real values), or None without one."""
    if not job.secret_env:
        return None
    name = job_name(spec)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": env_secret_name(name),
            "namespace": k8s.namespace,
            "labels": labels(spec),
        },
        "type": "Opaque",
        "stringData": dict(job.secret_env),
    }


def worker_env(spec: ClusterSpec, job: Job) -> list[dict[str, Any]]:
    """The training container's environment: unbuffered output, the threads per worker, and
    each secret variable as a reference into `env_secret`."""
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # see cluster.local.plan: a shared rendezvous store breaks elastic restarts (torch 2.15)
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
    ]
    threads = threads_per_worker(spec)
    if threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    secret = env_secret_name(job_name(spec))
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for key in job.secret_env
    ]
    return env


def storage_secret_env(k8s: KubernetesSpec, taken: set[str]) -> list[dict[str, Any]]:
    """`kubernetes.storageSecret`'s keys as environment variables, each optional (a Secret need
    not hold them all), leaving out the names `taken` by the job's own environment."""
    if k8s.storage_secret is None:
        return []
    keys = k8s.storage_secret_keys or STORAGE_SECRET_KEYS
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {"name": k8s.storage_secret, "key": key, "optional": True}
            },
        }
        for key in keys
        if key not in taken
    ]


def resources(spec: ClusterSpec, k8s: KubernetesSpec, notes: list[str]) -> dict[str, Any]:
    """One pod's resources: a GPU per process on GPU sizes, the requested CPU and memory."""
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits[GPU_RESOURCE] = spec.processes_per_node
    elif spec.gpus_per_node is None:
        notes.append(f"vmSize {spec.vm_size} is unknown: no {GPU_RESOURCE} requested")
    if k8s.cpu is not None:
        requests["cpu"] = k8s.cpu
    if k8s.memory is not None:
        requests["memory"] = k8s.memory
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def placement(spec: ClusterSpec) -> dict[str, Any]:
    """nodeSelector (AKS labels each node with its VM size) and the GPU taint's toleration."""
    out: dict[str, Any] = {}
    if spec.vm_size != "local" and spec.vcpus_per_node is not None:
        out["nodeSelector"] = {"node.kubernetes.io/instance-type": spec.vm_size}
    if spec.gpus_per_node:
        out["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return out


def shm_volume() -> dict[str, Any]:
    # DataLoader workers share tensors through /dev/shm, 64 MiB by default in a pod
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}


def shm_mount() -> dict[str, Any]:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def torchrun_args(spec: ClusterSpec, job: Job) -> list[str]:
    """torchrun's arguments after the node shape: restarts, then the worker module and argv,
    as a container's args carry them (`container_literal`)."""
    args = ["--max-restarts", str(spec.max_restarts), "-m", job.entry_module, *job.bound_argv()]
    return [container_literal(arg) for arg in args]


def container_literal(text: str) -> str:
    """`text` as a container's command or args must give it for the process to get it: the
    kubelet replaces `$(NAME)` by the variable NAME and `$$` by `$`, so every `$` is doubled."""
    return text.replace("$", "$$")


def pod_notes(spec: ClusterSpec, job: Job) -> list[str]:
    """What the plan should tell the user about pods and storage."""
    notes: list[str] = []
    if job.secret_env:
        notes.append(
            f"{', '.join(job.secret_env)} reach the pods from Secret "
            f"{env_secret_name(job_name(spec))} (applied with the job; secret.yaml shows it "
            "redacted: fill in the values before applying it yourself)"
        )
    if spec.data.mode == "mount":
        notes.append(
            "data.mode mount: pods read the store from its URL; mount it yourself (a PVC) and "
            "pass that path as STORE if you need a filesystem mount"
        )
    for name, out in job.outputs.items():
        if not out.startswith(("az://", "abfs://", "s3://", "gs://", "/")):
            notes.append(
                f"output {name} {out}: use a path on shared storage so every pod and you see it"
            )
    if spec.setup_command:
        notes.append("setupCommand is not run: bake it into kubernetes.image")
    return notes
