"""What every Kubeflow pod gets, for both job kinds: resources and placement by VM size, and
the job's secret environment through a Secret, never inline."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.engine import LaunchOptions, launch_plan, write_plan_files
from tests.cluster.kubeflow_manifests import (
    ACCOUNT_KEY,
    STORAGE_OPTIONS,
    assert_kubeflow_accepts,
    k8s_spec,
    plan_of,
)


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
