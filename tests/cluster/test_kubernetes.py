"""Kubernetes: the TrainJob (default) and the PyTorchJob validate field by field against
Kubeflow's published CRDs (tests/data/kubeflow) and follow the admission rules the schema cannot
say; secrets reach the pods through a Secret; launch goes through kubectl (or says how without
it) and waits on the job's conditions."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster import kubernetes
from cluster.clusterjson import parse_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job, write_plan_files
from cluster.errors import ClusterSpecError, EngineUnavailableError, LaunchError
from cluster.kubernetes import KubernetesPlan
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
CRDS = {"trainjob": TRAINJOB_CRD, "pytorchjob": PYTORCHJOB_CRD}


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


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_small_and_cpu_jobs_match_the_crd(api: str) -> None:
    single = plan_of(k8s_spec(api, targetNodeCount=1)).manifest
    cpu = plan_of(k8s_spec(api, vmSize="Standard_D16s_v3", processesPerNode=2)).manifest
    unknown = plan_of(k8s_spec(api, vmSize="Custom_Size_v9", processesPerNode=1))
    for manifest in (single, cpu, unknown.manifest):
        assert_kubeflow_accepts(copy.deepcopy(dict(manifest)))
    assert "vmSize Custom_Size_v9 is unknown: no nvidia.com/gpu requested" in unknown.describe()
    if api == "trainjob":
        assert single["spec"]["trainer"]["numNodes"] == 1
        assert cpu["spec"]["trainer"]["resourcesPerNode"] == {"requests": {"memory": "64Gi"}}
        patch = cpu["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        assert (
            "tolerations" not in patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        )
        return
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert single["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "Never"
    elastic_one = plan_of(k8s_spec(api, targetNodeCount=1, elastic={"maxRestarts": 1})).manifest
    assert list(elastic_one["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    container = cpu["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert "limits" not in container["resources"]  # no GPU asked of a CPU size


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


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_secrets_go_to_a_secret_redacted_in_the_plan_and_applied_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    plan = plan_of(k8s_spec(api), secret=True)
    assert_kubeflow_accepts(copy.deepcopy(dict(plan.manifest)))
    assert ACCOUNT_KEY not in json.dumps(plan.manifest)  # never inline in the job object
    written = write_plan_files(plan, tmp_path / "plan")
    assert {p.name for p in written} == {"plan.txt", f"{api}.yaml", "secret.yaml"}
    for text in [plan.describe(), *(p.read_text() for p in written)]:
        assert ACCOUNT_KEY not in text
    assert "secret: training/landcover-nc24-env (LANDCOVER_STORAGE_OPTIONS)" in plan.describe()
    shown = yaml.safe_load((tmp_path / "plan" / "secret.yaml").read_text())
    assert shown["stringData"] == {"LANDCOVER_STORAGE_OPTIONS": "<redacted>"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    applied = tmp_path / "applied.yaml"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\ncat > {applied}\necho "created"\n')
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    result = launch_plan(plan, LaunchOptions())
    assert (result.status, result.job_id) == ("submitted", "training/landcover-nc24")
    assert "&id" not in applied.read_text()  # plain YAML, no anchors for kubectl to expand
    secret, job = yaml.safe_load_all(applied.read_text())
    assert (secret["kind"], job["kind"]) == ("Secret", plan.manifest["kind"])
    # what runs keeps the real value, in the Secret only
    assert secret["stringData"] == {"LANDCOVER_STORAGE_OPTIONS": STORAGE_OPTIONS}
    assert ACCOUNT_KEY not in json.dumps(job)
    if api == "trainjob":
        env = job["spec"]["trainer"]["env"]
    else:
        env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
            "env"
        ]
    (ref,) = [e for e in env if e["name"] == "LANDCOVER_STORAGE_OPTIONS"]
    assert ref == {
        "name": "LANDCOVER_STORAGE_OPTIONS",
        "valueFrom": {
            "secretKeyRef": {"name": "landcover-nc24-env", "key": "LANDCOVER_STORAGE_OPTIONS"}
        },
    }


def test_launch_without_kubectl_or_with_a_failing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_of(k8s_spec())
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        EngineUnavailableError, match=r"kubectl not found on PATH: install it.* apply trainjob.yaml"
    ):
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
    kubectl.write_text(
        '#!/bin/sh\necho \'The TrainJob "landcover-nc24" is invalid: spec.trainer: Invalid '
        'value: "object": field is immutable\' >&2\nexit 1\n'
    )
    with pytest.raises(LaunchError) as info:
        launch_plan(plan, LaunchOptions())
    assert str(info.value).endswith(
        "field is immutable; a TrainJob training/landcover-nc24 exists already: delete it "
        "(kubectl delete -n training trainjob landcover-nc24) or change name in cluster.json"
    )


def fake_kubectl(tmp_path: Path, conditions: list[dict[str, str]]) -> Path:
    """A kubectl whose `apply` succeeds and whose `get` answers with these job conditions
    after one answer without any (the job still starting)."""
    status = json.dumps({"status": {"conditions": conditions}})
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "kubectl"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$1" in apply) cat > /dev/null; echo created;;\n'
        f"  get) if [ $(grep -c '^get' {calls}) -lt 2 ]; then echo '{{}}'; "
        f"else echo '{status}'; fi;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return calls


@pytest.mark.parametrize(("api", "done"), [("trainjob", "Complete"), ("pytorchjob", "Succeeded")])
def test_wait_follows_the_job_conditions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, done: str
) -> None:
    monkeypatch.setattr(kubernetes, "POLL_INTERVAL_S", 0.01)
    calls = fake_kubectl(
        tmp_path, [{"type": "Created", "status": "True"}, {"type": done, "status": "True"}]
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    result = launch_plan(plan_of(k8s_spec(api)), LaunchOptions(wait=True))
    assert result.status == "succeeded"
    label = (
        "jobset.sigs.k8s.io/jobset-name" if api == "trainjob" else "training.kubeflow.org/job-name"
    )
    assert result.log_location == f"kubectl logs -n training -l {label}=landcover-nc24"
    gets = [line for line in calls.read_text().splitlines() if line.startswith("get")]
    assert gets == [f"get -n training {api}/landcover-nc24 -o json"] * 2


def test_wait_reports_a_failed_job_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes, "POLL_INTERVAL_S", 0.01)
    fake_kubectl(
        tmp_path,
        [
            {
                "type": "Failed",
                "status": "True",
                "reason": "JobSetFailed",
                "message": "node-0 exited 1",
            }
        ],
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(LaunchError) as info:
        launch_plan(plan_of(k8s_spec()), LaunchOptions(wait=True))
    assert str(info.value) == (
        "TrainJob training/landcover-nc24 failed (node-0 exited 1); logs: "
        "kubectl logs -n training -l jobset.sigs.k8s.io/jobset-name=landcover-nc24"
    )


def test_the_kubernetes_section() -> None:
    runtime = k8s_spec(
        kubernetes={
            "image": "i",
            "runtime": "torch-gpu",
            "runtimeKind": "TrainingRuntime",
            "imagePullPolicy": "Always",
            "storageSecret": "s",
            "storageSecretKeys": ["AZURE_STORAGE_SAS_TOKEN"],
        }
    )
    plan = plan_of(runtime)
    assert plan.manifest["spec"]["runtimeRef"]["name"] == "torch-gpu"
    assert plan.manifest["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    secret_env = [e for e in plan.manifest["spec"]["trainer"]["env"] if "valueFrom" in e]
    assert [e["name"] for e in secret_env] == ["AZURE_STORAGE_SAS_TOKEN"]
    assert "note: imagePullPolicy is not a TrainJob field" in plan.describe()
    assert runtime.kubernetes is not None
    v1 = plan_of(replace(runtime, kubernetes=replace(runtime.kubernetes, api="pytorchjob")))
    container = v1.manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"
    ][0]
    assert container["imagePullPolicy"] == "Always"
    bad: list[tuple[dict[str, Any], str]] = [
        (
            {"image": "i", "api": "mpijob"},
            "kubernetes.api must be 'trainjob' or 'pytorchjob', got 'mpijob'",
        ),
        (
            {"image": "i", "runtmie": "x"},
            "unknown field 'kubernetes.runtmie': did you mean 'runtime'?",
        ),
        (
            {"image": "i", "storageSecret": "s", "storageSecretKeys": ["AZURE KEY"]},
            "kubernetes.storageSecretKeys must list environment variable names "
            "(letters, digits, '_'), got 'AZURE KEY'",
        ),
        (
            {"image": "i", "storageSecretKeys": ["A"]},
            "kubernetes.storageSecretKeys needs kubernetes.storageSecret",
        ),
    ]
    for section, message in bad:
        with pytest.raises(ClusterSpecError) as info:
            k8s_spec(kubernetes=section)
        assert str(info.value).startswith(f"cluster.json: {message}"), str(info.value)
