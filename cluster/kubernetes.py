"""The Kubernetes engine: a Kubeflow `PyTorchJob` (kubeflow.org/v1) manifest.

Replica specs follow the training operator's rules: `Master` (exactly 1 replica) plus `Worker`
(targetNodeCount - 1) — with `elastic`, a `Worker` spec is required, so a 1-node elastic job is
one Worker. Each pod's container is named `pytorch` (the operator looks for that name), runs
`torchrun` (configured by the operator's PET_* / MASTER_* environment, with shell fallbacks for
older operators) and asks for `nvidia.com/gpu` when the VM size has GPUs. With `elastic` the
job gets `elasticPolicy` (rdzvBackend c10d, minReplicas/maxReplicas = elastic min/max nodes,
maxRestarts); the pods of a restarted group run the same arguments again.

`launch` pipes the manifest to `kubectl apply -f -` (never written to disk unredacted); without
kubectl it says how to apply the planned file instead.
"""

from __future__ import annotations

import copy
import logging
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.engine import (
    Job,
    LaunchOptions,
    LaunchResult,
    Plan,
    job_redactor,
    threads_per_worker,
)
from cluster.errors import ClusterError, EngineUnavailableError, LaunchError
from cluster.redact import Redactor
from cluster.spec import ClusterSpec, KubernetesSpec

logger = logging.getLogger(__name__)

API_VERSION = "kubeflow.org/v1"
CONTAINER_NAME = "pytorch"  # the training operator finds the training container by this name
PORT_NAME = "pytorchjob-port"
PORT = 23456
KUBECTL_TIMEOUT_S = 60.0
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class KubernetesPlan:
    spec: ClusterSpec
    job: Job
    manifest: Mapping[str, Any]  # real values: what is applied
    notes: tuple[str, ...]
    redactor: Redactor = field(repr=False, compare=False)
    engine: str = "kubernetes"

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    def describe(self) -> str:
        spec = self.spec
        replicas = self.manifest["spec"]["pytorchReplicaSpecs"]
        shape = ", ".join(f"{role} x {r['replicas']}" for role, r in replicas.items())
        any_role = next(iter(replicas.values()))
        container = any_role["template"]["spec"]["containers"][0]
        lines = [
            "engine: kubernetes (Kubeflow PyTorchJob, kubeflow.org/v1)",
            f"job: {self.namespace}/{self.name}: {shape}; {spec.processes_per_node} "
            f"process(es) per pod = {spec.workers} worker(s)",
            f"image: {container['image']}",
            f"resources: {container.get('resources') or 'none requested'}",
        ]
        policy = self.manifest["spec"].get("elasticPolicy")
        if policy:
            lines.append(
                f"elastic: {policy['minReplicas']}..{policy['maxReplicas']} nodes, "
                f"up to {policy['maxRestarts']} restarts (c10d)"
            )
        lines.append(f"command: {container['command'][-1]}")
        lines += [f"note: {n}" for n in self.notes]
        return self.redactor.text("\n".join(lines))

    def files(self) -> dict[str, str]:
        document = self.redactor.data(self.manifest)
        return {"pytorchjob.yaml": yaml.safe_dump(document, sort_keys=False, width=1000)}


class KubernetesEngine:
    def plan(self, spec: ClusterSpec, job: Job) -> KubernetesPlan:
        if spec.kubernetes is None:
            raise ClusterError('engine "kubernetes" needs a "kubernetes" section in cluster.json')
        manifest, notes = build_manifest(spec, spec.kubernetes, job)
        return KubernetesPlan(
            spec=spec, job=job, manifest=manifest, notes=notes, redactor=job_redactor(spec, job)
        )

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult:
        if not isinstance(plan, KubernetesPlan):
            raise TypeError(f"the kubernetes engine cannot launch a {plan.engine} plan")
        return _apply(plan, options)


def job_name(spec: ClusterSpec) -> str:
    """The PyTorchJob name: the spec name as a DNS-1035 label (the operator's rule)."""
    name = spec.name.lower()
    if not _DNS1035.match(name):
        raise ClusterError(f"name {spec.name!r} cannot name a PyTorchJob: use a-z, 0-9 and '-'")
    return name


def build_manifest(
    spec: ClusterSpec, k8s: KubernetesSpec, job: Job
) -> tuple[dict[str, Any], tuple[str, ...]]:
    notes = list(spec.notes)
    args = job.bound_argv()
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
        f" --max-restarts {spec.max_restarts}"
        f" -m {shlex.quote(job.entry_module)} {shlex.join(args)}"
    )
    env = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # see cluster.local: a shared rendezvous store breaks elastic restarts (torch 2.15)
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
    ]
    threads = threads_per_worker(spec)
    if threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    # secrets (the storage options) as pod environment, never in the command line
    env += [{"name": name, "value": value} for name, value in job.secret_env.items()]
    if job.secret_env:
        notes.append(
            f"{', '.join(job.secret_env)} go to the pods in the manifest's env: prefer "
            "kubernetes.storageSecret (a Secret the pods read) to keep them out of the job object"
        )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": k8s.image,
        "imagePullPolicy": k8s.image_pull_policy,
        "command": ["/bin/sh", "-c", torchrun],
        "env": env,
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        # DataLoader workers share tensors through /dev/shm, 64 MiB by default in a pod
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if k8s.storage_secret:
        container["envFrom"] = [{"secretRef": {"name": k8s.storage_secret}}]
    resources = _resources(spec, k8s, notes)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if spec.vm_size != "local" and spec.vcpus_per_node is not None:
        # AKS labels each node with its VM size
        pod_spec["nodeSelector"] = {"node.kubernetes.io/instance-type": spec.vm_size}
    if spec.gpus_per_node:
        pod_spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
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
        "kind": "PyTorchJob",
        "metadata": {
            "name": job_name(spec),
            "namespace": k8s.namespace,
            "labels": {
                "app.kubernetes.io/name": "landcover",
                "landcover/workers": str(spec.workers),
            },
        },
        "spec": job_spec,
    }
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
    return manifest, tuple(notes)


def _resources(spec: ClusterSpec, k8s: KubernetesSpec, notes: list[str]) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if spec.gpus_per_node:
        limits["nvidia.com/gpu"] = spec.processes_per_node
    elif spec.gpus_per_node is None:
        notes.append(f"vmSize {spec.vm_size} is unknown: no nvidia.com/gpu requested")
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


def _apply(plan: KubernetesPlan, options: LaunchOptions) -> LaunchResult:
    kubectl = shutil.which("kubectl", path=options.env.get("PATH"))
    if kubectl is None:
        raise EngineUnavailableError(
            "kubectl not found on PATH: install it and point it at your cluster, or apply "
            "pytorchjob.yaml from `landcover cluster plan CLUSTER_JSON --out DIR -- ...` yourself"
        )
    started = time.monotonic()
    manifest = yaml.safe_dump(dict(plan.manifest), sort_keys=False)
    try:
        done = subprocess.run(
            [kubectl, "apply", "--request-timeout=30s", "-f", "-"],
            input=manifest,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(f"kubectl apply gave no answer within {KUBECTL_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        first = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[0]
        raise LaunchError(plan.redactor.text(f"kubectl apply failed: {first}"))
    logger.info("applied PyTorchJob %s/%s", plan.namespace, plan.name)
    if options.wait:
        _wait_for(kubectl, plan, options.timeout_s)
    return LaunchResult(
        engine="kubernetes",
        job_id=f"{plan.namespace}/{plan.name}",
        status="succeeded" if options.wait else "submitted",
        run_dir=None,
        log_location=f"kubectl logs -n {plan.namespace} -l "
        f"training.kubeflow.org/job-name={plan.name}",
        wall_time_s=time.monotonic() - started,
    )


def _wait_for(kubectl: str, plan: KubernetesPlan, timeout_s: float | None) -> None:
    timeout = f"{int(timeout_s)}s" if timeout_s else "168h"
    done = subprocess.run(
        [
            kubectl,
            "wait",
            "-n",
            plan.namespace,
            "--for=condition=Succeeded",
            f"--timeout={timeout}",
            f"pytorchjob/{plan.name}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        first = (done.stderr.strip() or "no output").splitlines()[0]
        raise LaunchError(
            plan.redactor.text(
                f"PyTorchJob {plan.namespace}/{plan.name} did not succeed ({first}); logs: "
                f"kubectl logs -n {plan.namespace} -l training.kubeflow.org/job-name={plan.name}"
            )
        )
