"""cluster.json documents and plans shared by the cluster and CLI tests: the legacy Batch AI
tutorial file with a blob mount, Azure ML and Kubernetes specs, and a SLURM plan of a fake job
whose environment carries a secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import plan_job
from cluster.slurm.plan import SlurmPlan
from tests.cluster.fake_worker import fake_job

ACCOUNT_KEY = "c2VjcmV0LWFjY291bnQta2V5LWZvci10ZXN0cw=="

LEGACY_TUTORIAL: dict[str, Any] = {
    "properties": {
        "vmSize": "STANDARD_NC6",
        "vmPriority": "dedicated",
        "scaleSettings": {"manual": {"targetNodeCount": 2}},
        "nodeSetup": {
            "mountVolumes": {
                "azureBlobFileSystems": [
                    {
                        "accountName": "landcoverdata",
                        "containerName": "chips",
                        "relativeMountPath": "bfs",
                        "credentials": {"accountKey": ACCOUNT_KEY},
                    }
                ]
            },
            "setupTask": {
                "commandLine": "pip install landcover",
                "stdOutErrPathPrefix": "$AZ_BATCHAI_MOUNT_ROOT/bfs",
            },
        },
    }
}

AZUREML_SPEC: dict[str, Any] = {
    **LEGACY_TUTORIAL,
    "engine": "azureml",
    "azureml": {
        "subscriptionId": "00000000-0000-0000-0000-000000000000",
        "resourceGroup": "rg",
        "workspace": "ws",
        "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest",
    },
}

KUBERNETES_SPEC: dict[str, Any] = {
    "engine": "kubernetes",
    "vmSize": "Standard_NC12s_v3",
    "targetNodeCount": 2,
    "elastic": {"maxRestarts": 1},
    "kubernetes": {"image": "myregistry.azurecr.io/landcover:1"},
}

SECRET = "c2VjcmV0LXNsdXJtLWFjY291bnQta2V5"
SECRET_ENV = {"LANDCOVER_STORAGE_OPTIONS": json.dumps({"account_key": SECRET})}


def write_json(path: Path, document: dict[str, Any]) -> Path:
    """`document` as JSON at `path`."""
    path.write_text(json.dumps(document))
    return path


def slurm_plan(
    run_dir: Path, section: dict[str, object] | None = None, **spec: object
) -> SlurmPlan:
    """The SLURM plan of a 2-node spec (`spec`, with `section` as its "slurm" section) for a
    fake training job whose environment holds SECRET."""
    document = {"engine": "slurm", "targetNodeCount": 2, **spec}
    if section is not None:
        document["slurm"] = section
    job = fake_job("/shared/chips.zarr", str(run_dir), "--epochs", "3", secret_env=SECRET_ENV)
    plan = plan_job(parse_cluster_spec(document), job)
    assert isinstance(plan, SlurmPlan)
    return plan
