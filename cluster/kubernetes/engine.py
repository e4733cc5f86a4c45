"""The Kubernetes engine: a Kubeflow Trainer v2 `TrainJob` (`cluster.kubernetes.trainjob`, the
default) or a training-operator v1 `PyTorchJob` (`cluster.kubernetes.pytorchjob`,
`"kubernetes": {"api": "pytorchjob"}`), plus the Secret that carries the job's secret
environment (`cluster.kubernetes.pod`).

`launch` pipes the Secret and the job to `kubectl apply -f -` (never written to disk
unredacted); without kubectl it says how to apply the planned files instead. With `--wait` it
polls the job's conditions until it completes or fails.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.engine import Job, LaunchOptions, LaunchResult, PlanEngine, job_redactor
from cluster.errors import EngineUnavailableError, LaunchError
from cluster.kubernetes import pytorchjob, trainjob
from cluster.kubernetes.pod import env_secret
from cluster.kubernetes.section import KubernetesSpec
from cluster.redact import Redactor
from cluster.spec import ClusterSpec

logger = logging.getLogger(__name__)

KUBECTL_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class _Api:
    """What differs between the two job kinds once the manifest is built."""

    kind: str
    title: str
    build: Callable[[ClusterSpec, KubernetesSpec, Job], tuple[dict[str, Any], tuple[str, ...]]]
    done_condition: str  # the condition type that means success
    pod_label: str  # the label that selects the job's pods (for kubectl logs)


_APIS: dict[str, _Api] = {
    "trainjob": _Api(
        trainjob.KIND,
        f"Kubeflow Trainer v2 TrainJob, {trainjob.API_VERSION}",
        trainjob.build_trainjob,
        "Complete",
        "jobset.sigs.k8s.io/jobset-name",  # a TrainJob runs as a JobSet of its name
    ),
    "pytorchjob": _Api(
        pytorchjob.KIND,
        f"Kubeflow PyTorchJob, {pytorchjob.API_VERSION}",
        pytorchjob.build_pytorchjob,
        "Succeeded",
        "training.kubeflow.org/job-name",
    ),
}


@dataclass(frozen=True, slots=True)
class KubernetesPlan:
    spec: ClusterSpec
    job: Job
    manifest: Mapping[str, Any]  # the job object, real values: what is applied
    secret: Mapping[str, Any] | None  # the Secret with the job's secret environment, real values
    notes: tuple[str, ...]
    redactor: Redactor = field(repr=False, compare=False)
    engine: str = "kubernetes"

    @property
    def api(self) -> _Api:
        return next(a for a in _APIS.values() if a.kind == self.manifest["kind"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    @property
    def documents(self) -> list[Mapping[str, Any]]:
        """What `launch` applies, in order: the Secret first, since the pods read it."""
        return [d for d in (self.secret, self.manifest) if d is not None]

    @property
    def log_command(self) -> str:
        return f"kubectl logs -n {self.namespace} -l {self.api.pod_label}={self.name}"

    def describe(self) -> str:
        spec = self.spec
        lines = [f"engine: kubernetes ({self.api.title})"]
        if self.api.kind == trainjob.KIND:
            lines += _describe_trainjob(self.manifest, spec)
        else:
            lines += _describe_pytorchjob(self.manifest, spec)
        if self.secret is not None:
            keys = ", ".join(self.secret["stringData"])
            lines.append(f"secret: {self.namespace}/{self.secret['metadata']['name']} ({keys})")
        lines += [f"note: {n}" for n in self.notes]
        return self.redactor.text("\n".join(lines))

    def files(self) -> dict[str, str]:
        out = {f"{self.api.kind.lower()}.yaml": _dump(self.redactor.data(self.manifest))}
        if self.secret is not None:
            out["secret.yaml"] = _dump(self.redactor.data(self.secret))
        return out


def _describe_trainjob(manifest: Mapping[str, Any], spec: ClusterSpec) -> list[str]:
    meta, job_spec = manifest["metadata"], manifest["spec"]
    trainer, runtime = job_spec["trainer"], job_spec["runtimeRef"]
    return [
        f"job: {meta['namespace']}/{meta['name']}: {trainer['numNodes']} node(s) on "
        f"{runtime['kind']} {runtime['name']}; {trainer['numProcPerNode']} process(es) per "
        f"node = {spec.workers} worker(s)",
        f"image: {trainer['image']}",
        f"resources per node: {trainer.get('resourcesPerNode') or 'none requested'}",
        f"command: {shlex.join([*trainer['command'], *trainer['args']])}",
    ]


def _describe_pytorchjob(manifest: Mapping[str, Any], spec: ClusterSpec) -> list[str]:
    meta, job_spec = manifest["metadata"], manifest["spec"]
    replicas = job_spec["pytorchReplicaSpecs"]
    shape = ", ".join(f"{role} x {r['replicas']}" for role, r in replicas.items())
    container = next(iter(replicas.values()))["template"]["spec"]["containers"][0]
    lines = [
        f"job: {meta['namespace']}/{meta['name']}: {shape}; {spec.processes_per_node} "
        f"process(es) per pod = {spec.workers} worker(s)",
        f"image: {container['image']}",
        f"resources: {container.get('resources') or 'none requested'}",
    ]
    policy = job_spec.get("elasticPolicy")
    if policy:
        lines.append(
            f"elastic: {policy['minReplicas']}..{policy['maxReplicas']} nodes, "
            f"up to {policy['maxRestarts']} restarts (c10d)"
        )
    lines.append(f"command: {container['command'][-1]}")
    return lines


def _dump(document: Any) -> str:
    return str(yaml.safe_dump(document, sort_keys=False, width=1000))


class KubernetesEngine(PlanEngine[KubernetesPlan]):
    """A Kubeflow job applied with kubectl: a TrainJob or a PyTorchJob (`kubernetes.api`)."""

    plan_type = KubernetesPlan

    def plan(self, spec: ClusterSpec, job: Job) -> KubernetesPlan:
        k8s = spec.required_section(KubernetesSpec)
        manifest, notes = _APIS[k8s.api].build(spec, k8s, job)
        return KubernetesPlan(
            spec=spec,
            job=job,
            manifest=manifest,
            secret=env_secret(spec, k8s, job),
            notes=notes,
            redactor=job_redactor(spec, job),
        )

    def run(self, plan: KubernetesPlan, options: LaunchOptions) -> LaunchResult:
        return _apply(plan, options)


def _kubectl(kubectl: str, plan: KubernetesPlan, *args: str, stdin: str | None = None) -> str:
    """Run kubectl; its stdout, or one LaunchError line (redacted) when it fails."""
    try:
        done = subprocess.run(
            [kubectl, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"kubectl {args[0]} gave no answer within {KUBECTL_TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        first = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[0]
        raise LaunchError(plan.redactor.text(f"kubectl {args[0]} failed: {first}"))
    return done.stdout


def _apply(plan: KubernetesPlan, options: LaunchOptions) -> LaunchResult:
    kubectl = shutil.which("kubectl", path=options.env.get("PATH"))
    if kubectl is None:
        files = " and ".join(plan.files())
        raise EngineUnavailableError(
            "kubectl not found on PATH: install it and point it at your cluster, or apply "
            f"{files} from `landcover cluster plan CLUSTER_JSON --out DIR -- ...` yourself"
        )
    started = time.monotonic()
    documents = yaml.safe_dump_all([dict(d) for d in plan.documents], sort_keys=False)
    try:
        _kubectl(kubectl, plan, "apply", "--request-timeout=30s", "-f", "-", stdin=documents)
    except LaunchError as exc:
        if "immutable" not in str(exc):
            raise
        # a job's spec cannot change once created: the same name was launched before
        raise LaunchError(
            f"{exc}; a {plan.api.kind} {plan.namespace}/{plan.name} exists already: delete it "
            f"(kubectl delete -n {plan.namespace} {plan.api.kind.lower()} {plan.name}) or "
            "change name in cluster.json"
        ) from None
    logger.info("applied %s %s/%s", plan.api.kind, plan.namespace, plan.name)
    if options.wait:
        _wait_for(kubectl, plan, options.timeout_s)
    return LaunchResult(
        engine="kubernetes",
        job_id=f"{plan.namespace}/{plan.name}",
        status="succeeded" if options.wait else "submitted",
        run_dir=None,
        log_location=plan.log_command,
        wall_time_s=time.monotonic() - started,
    )


def _wait_for(kubectl: str, plan: KubernetesPlan, timeout_s: float | None) -> None:
    """Poll the job's conditions until its success condition or `Failed` is true."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    resource = f"{plan.api.kind.lower()}/{plan.name}"
    while True:
        text = _kubectl(kubectl, plan, "get", "-n", plan.namespace, resource, "-o", "json")
        try:
            conditions = json.loads(text).get("status", {}).get("conditions", [])
        except (ValueError, AttributeError):
            conditions = []
        true = {c.get("type"): c for c in conditions if c.get("status") == "True"}
        if plan.api.done_condition in true:
            return
        if "Failed" in true:
            why = true["Failed"].get("message") or true["Failed"].get("reason") or "no message"
            raise LaunchError(
                plan.redactor.text(
                    f"{plan.api.kind} {plan.namespace}/{plan.name} failed ({why}); logs: "
                    f"{plan.log_command}"
                )
            )
        if deadline is not None and time.monotonic() >= deadline:
            raise LaunchError(
                f"{plan.api.kind} {plan.namespace}/{plan.name} did not finish within "
                f"{timeout_s:g} s; it keeps running: follow it with {plan.log_command}"
            )
        time.sleep(
            POLL_INTERVAL_S
            if deadline is None
            else max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic()))
        )
