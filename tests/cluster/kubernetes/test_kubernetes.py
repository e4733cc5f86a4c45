"""Kubernetes engine: the kubernetes section of cluster.json, launch through kubectl (or how
without it), and --wait following the job's conditions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cluster.engine import LaunchOptions, launch_plan
from cluster.errors import ClusterSpecError, EngineUnavailableError, LaunchError
from cluster.kubernetes import engine as kubernetes
from cluster.kubernetes.section import KubernetesSpec
from tests.cluster.kubeflow_manifests import (
    k8s_spec,
    plan_of,
)


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
    section = runtime.section_of(KubernetesSpec)
    assert section is not None
    v1 = plan_of(replace(runtime, section=replace(section, api="pytorchjob")))
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


def test_wait_gives_up_at_the_timeout_and_says_the_job_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes, "POLL_INTERVAL_S", 0.01)
    fake_kubectl(tmp_path, [{"type": "Created", "status": "True"}])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(LaunchError) as info:
        launch_plan(plan_of(k8s_spec()), LaunchOptions(wait=True, timeout_s=0.2))
    assert str(info.value) == (
        "TrainJob training/landcover-nc24 did not finish within 0.2 s; it keeps running: "
        "follow it with kubectl logs -n training -l jobset.sigs.k8s.io/jobset-name=landcover-nc24"
    )
