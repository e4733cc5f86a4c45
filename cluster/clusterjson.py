"""cluster.json → `ClusterSpec`: the legacy Azure Batch AI form or the flat form.

Flat form (only `targetNodeCount` is required on the local engine)::

    {
      "name": "landcover",                  letters, digits, hyphens; starts with a letter
      "engine": "local",                    "local" (default) | "azureml" | "kubernetes" | "slurm"
                                            | "dask"
      "vmSize": "local",                    "local" (this machine) or an Azure size; on slurm,
                                            leave it out (or give a size: its GPUs and vCPUs)
      "vmPriority": "dedicated",            "dedicated" | "lowpriority"
      "targetNodeCount": 2,
      "processesPerNode": "auto",           "auto" = GPUs of the VM size (1 on CPU), or a number
      "elastic": {"minNodes": 1, "maxNodes": 4, "maxRestarts": 3},
      "data": {"url": "az://chips/naip.zarr", "mode": "mount", "accountName": "myaccount"},
      "mounts": [{"accountName": "...", "containerName": "...", "relativeMountPath": "afs"}],
      "setupCommand": "pip install ...",
      "azureml": {"subscriptionId": "...", "resourceGroup": "...", "workspace": "...",
                  "computeName": "landcover", "experimentName": "landcover",
                  "idleSecondsBeforeScaleDown": 1800, "code": ".",
                  "baseImage": "pytorch/pytorch:...",  or one of
                  "image": "myregistry.azurecr.io/landcover:latest",
                  "environment": "landcover-env:3"},
      "kubernetes": {"api": "trainjob", "runtime": "torch-distributed",
                     "runtimeKind": "ClusterTrainingRuntime", "namespace": "default",
                     "image": "...", "imagePullPolicy": "IfNotPresent",
                     "storageSecret": "chips-storage",
                     "storageSecretKeys": ["AZURE_STORAGE_ACCOUNT_KEY"],
                     "cpu": "4", "memory": "16Gi"},
      "slurm": {"partition": "gpu", "account": "proj42", "timeLimit": "HH:MM:SS",
                "gpusPerNode": 4, "cpusPerTask": 8, "setup": ["module load cuda", "..."],
                "extraDirectives": ["--exclusive"], "socketInterface": "ib0"},
      "dask": {"scheduler": "tcp://host:8786", "threadsPerWorker": 1, "connectTimeout": "30s"},
      "network": {"bandwidth": "1gbit", "latency": "2ms"}
    }

`dask` (engine "dask"): see `cluster.daskspec`; without `scheduler` a launch starts a
LocalCluster of targetNodeCount x processesPerNode workers on this machine.

`network` (local engine, root): each simulated node runs in its own network namespace behind a
link of that rate (tc units: "100mbit", "1gbit"); `latency` is a one-way delay, which needs the
kernel's netem (refused at launch where the kernel has none). See `cluster.netns`.

`kubernetes.api` is "trainjob" (Kubeflow Trainer v2, the default: `runtime` names the
ClusterTrainingRuntime, or with `runtimeKind` "TrainingRuntime" the namespaced runtime, that it
runs on) or "pytorchjob" (the training operator's v1 PyTorchJob). `storageSecretKeys` (TrainJob
only) lists the keys of `storageSecret` given to the pods; by default the usual storage
variables, each optional. Names and quantities are checked as the API server checks them:
`namespace` a DNS-1123 label, `runtime` and `storageSecret` DNS-1123 subdomains, `cpu` and
`memory` positive resource quantities ("4", "500m", "16Gi"). `azureml.experimentName` and
`computeName` follow Azure ML's rules for names.

Legacy form (the original Batch AI tutorial's cluster.json)::

    {"properties": {"vmSize": "STANDARD_NC6", "vmPriority": "dedicated",
                    "scaleSettings": {"manual": {"targetNodeCount": 2}},
                    "nodeSetup": {"mountVolumes": {"azureBlobFileSystems": [...]},
                                  "setupTask": {"commandLine": "..."}}}}

`azureml` environments: by default the plan builds one from `baseImage` (a PyTorch image; the
engine's default when left out) plus the project's dependencies, and the job installs the
uploaded `code` (the project directory when left out); `image` (a container with the project
installed) or `environment` (a registered Azure ML environment, `name:version` or
`name@latest`) replace that build. At most one of `image`, `environment`, `baseImage`.

It may carry the flat keys that Batch AI had no word for (`name`, `engine`, `processesPerNode`,
`elastic`, `data`, `azureml`, `kubernetes`) beside `properties`. Mapping:
`scaleSettings.manual.targetNodeCount` is `targetNodeCount`; `scaleSettings.autoScale` becomes an
elastic job that asks for `maximumNodeCount` nodes and runs on as few as
max(1, `minimumNodeCount`) (`initialNodeCount` is checked, then unused: Azure ML compute scales
from zero); `azureBlobFileSystems` become `mounts`; `setupTask.commandLine` becomes
`setupCommand`. Credentials in the file are collected only so that they can be redacted: no
engine copies an account key into a job definition. Both forms give the same `ClusterSpec`.

On the slurm engine a node is whatever the partition gives: GPUs per node are
`slurm.gpusPerNode` (else the VM size's, else none), and "auto" processes are one per GPU
(one on CPU nodes).

`elastic.maxRestarts` defaults to 3 when an `elastic` block (or autoScale) is present and to 0
otherwise; `minNodes`/`maxNodes` default to `targetNodeCount`.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cluster.daskspec import dask_spec
from cluster.engines import engine_info
from cluster.errors import ClusterSpecError
from cluster.machine import local_cpu_count, local_gpu_count
from cluster.redact import Redactor, collect_secret_values
from cluster.sections import azureml_spec, kubernetes_spec, network_shape, slurm_spec
from cluster.spec import (
    BlobMount,
    ClusterSpec,
    DataSpec,
    ElasticSpec,
    Priority,
)
from cluster.specfile import (
    DEFAULT_ELASTIC_RESTARTS,
    BlobMountSection,
    CommonSection,
    ElasticSection,
    FlatFile,
    LegacyFile,
    SlurmSection,
    validate_document,
)
from cluster.vmsizes import LOCAL, known_vm_sizes, lookup_vm_size

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*[A-Za-z0-9]$")
_NAME_MAX = 40  # a Kubeflow pod is "<name>-worker-<i>", and pod names stop at 63


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """Read and validate cluster.json; any problem is one ClusterSpecError line."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterSpecError(f"{source}: no such file; pass the path of a cluster.json") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ClusterSpecError(f"{source}: cannot read it ({exc.__class__.__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClusterSpecError(
            f"{source}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); "
            "fix the syntax (trailing commas and comments are not JSON)"
        ) from None
    return parse_cluster_spec(data, source=source)


def parse_cluster_spec(data: Any, *, source: str = "cluster.json") -> ClusterSpec:
    """Validate an already-parsed cluster.json document (legacy or flat form)."""
    if not isinstance(data, Mapping):
        raise ClusterSpecError(
            f"{source}: the top level must be a JSON object like "
            '{"targetNodeCount": 2}, got ' + type(data).__name__
        )
    secrets = collect_secret_values(data)
    redactor = Redactor(secrets)
    try:
        raw = validate_document(data)
        if isinstance(raw, LegacyFile):
            return _from_legacy(raw, secrets)
        return _from_flat(raw, secrets)
    except ClusterSpecError as exc:
        raise ClusterSpecError(redactor.text(f"{source}: {exc}")) from None


def _from_flat(raw: FlatFile, secrets: frozenset[str]) -> ClusterSpec:
    elastic = None
    if raw.elastic is not None:
        elastic = _elastic_from(raw.elastic, raw.target_node_count)
    return _resolve(
        common=raw,
        vm_size=raw.vm_size,
        priority=raw.vm_priority,
        target=raw.target_node_count,
        elastic=elastic,
        mounts=tuple(_mount(m) for m in raw.mounts),
        setup_command=raw.setup_command,
        notes=(),
        secrets=secrets,
    )


def _from_legacy(raw: LegacyFile, secrets: frozenset[str]) -> ClusterSpec:
    props = raw.properties
    scale = props.scale_settings
    if (scale.manual is None) == (scale.auto_scale is None):
        raise ClusterSpecError(
            "properties.scaleSettings needs exactly one of "
            '"manual": {"targetNodeCount": N} or "autoScale": {"minimumNodeCount", '
            '"maximumNodeCount", "initialNodeCount"}'
        )
    notes: list[str] = []
    if scale.manual is not None:
        target = scale.manual.target_node_count
        elastic = _elastic_from(raw.elastic, target) if raw.elastic else None
    else:
        auto = scale.auto_scale
        assert auto is not None  # one of the two, checked above
        if auto.minimum_node_count > auto.maximum_node_count:
            raise ClusterSpecError(
                f"properties.scaleSettings.autoScale.minimumNodeCount ({auto.minimum_node_count}) "
                f"is greater than maximumNodeCount ({auto.maximum_node_count}): "
                "make minimumNodeCount <= maximumNodeCount"
            )
        initial_ok = auto.minimum_node_count <= auto.initial_node_count <= auto.maximum_node_count
        if auto.initial_node_count != 0 and not initial_ok:
            raise ClusterSpecError(
                "properties.scaleSettings.autoScale.initialNodeCount "
                f"({auto.initial_node_count}) must lie between minimumNodeCount "
                f"({auto.minimum_node_count}) and maximumNodeCount ({auto.maximum_node_count})"
            )
        if raw.elastic and (raw.elastic.min_nodes or raw.elastic.max_nodes):
            raise ClusterSpecError(
                "elastic.minNodes/maxNodes conflict with properties.scaleSettings.autoScale: "
                "keep autoScale and give only elastic.maxRestarts"
            )
        target = auto.maximum_node_count
        restarts = raw.elastic.max_restarts if raw.elastic else DEFAULT_ELASTIC_RESTARTS
        elastic = ElasticSpec(max(1, auto.minimum_node_count), target, restarts)
    mounts: tuple[BlobMount, ...] = ()
    setup_command = None
    if props.node_setup is not None:
        if props.node_setup.mount_volumes is not None:
            mounts = tuple(
                _mount(m) for m in props.node_setup.mount_volumes.azure_blob_file_systems
            )
            other = sorted(set(props.node_setup.mount_volumes.model_extra or {}))
            if other:
                notes.append(f"nodeSetup.mountVolumes.{', '.join(other)} not carried over")
        if props.node_setup.setup_task is not None:
            setup_command = props.node_setup.setup_task.command_line
    ignored = sorted(set(props.model_extra or {}))
    if ignored:
        notes.append(f"properties.{', properties.'.join(ignored)} ignored (Batch AI only)")
    return _resolve(
        common=raw,
        vm_size=props.vm_size,
        priority=props.vm_priority,
        target=target,
        elastic=elastic,
        mounts=mounts,
        setup_command=setup_command,
        notes=tuple(notes),
        secrets=secrets,
    )


def _elastic_from(raw: ElasticSection, target: int) -> ElasticSpec:
    lo = raw.min_nodes if raw.min_nodes is not None else min(target, raw.max_nodes or target)
    hi = raw.max_nodes if raw.max_nodes is not None else max(target, lo)
    if lo > hi:
        raise ClusterSpecError(
            f"elastic.minNodes ({lo}) is greater than elastic.maxNodes ({hi}): "
            "make minNodes <= targetNodeCount <= maxNodes"
        )
    if not lo <= target <= hi:
        raise ClusterSpecError(
            f"targetNodeCount ({target}) is outside elastic.minNodes..maxNodes ({lo}..{hi}): "
            "make minNodes <= targetNodeCount <= maxNodes"
        )
    return ElasticSpec(lo, hi, raw.max_restarts)


def _mount(raw: BlobMountSection) -> BlobMount:
    return BlobMount(raw.account_name, raw.container_name, raw.relative_mount_path)


def _priority(text: str) -> Priority:
    key = text.replace("_", "").replace("-", "").lower()
    if key == "dedicated":
        return "dedicated"
    if key == "lowpriority":
        return "lowpriority"
    raise ClusterSpecError(f"vmPriority must be 'dedicated' or 'lowpriority', got {text!r}")


def _resolve(
    *,
    common: CommonSection,
    vm_size: str,
    priority: str,
    target: int,
    elastic: ElasticSpec | None,
    mounts: tuple[BlobMount, ...],
    setup_command: str | None,
    notes: tuple[str, ...],
    secrets: frozenset[str],
) -> ClusterSpec:
    name = common.name
    if not _NAME_RE.match(name) or len(name) > _NAME_MAX:
        raise ClusterSpecError(
            f"name {name!r} must be 2-{_NAME_MAX} letters, digits or hyphens, starting with a "
            "letter and not ending with a hyphen (it names the compute cluster and the job)"
        )
    engine = common.engine
    dask = dask_spec(common.dask) if engine == "dask" or common.dask is not None else None
    canonical, gpus, vcpus = _vm(vm_size, engine, here=dask is None or dask.embedded)
    gpu_source = canonical
    if engine == "slurm" and elastic is not None:
        raise ClusterSpecError(
            'engine "slurm" has no elastic restarts: drop "elastic" (or autoScale) and resubmit '
            "a failed job with --resume to continue from its checkpoint"
        )
    if engine == "dask" and elastic is not None:
        raise ClusterSpecError(
            'engine "dask" has no elastic restarts: drop "elastic" (tile and predict tasks are '
            "retried on their own; resume a failed training with --resume)"
        )
    slurm = None
    if engine == "slurm" or common.slurm is not None:
        slurm = slurm_spec(common.slurm or SlurmSection())
        if engine == "slurm" and common.slurm and common.slurm.gpus_per_node is not None:
            gpus, gpu_source = common.slurm.gpus_per_node, "slurm.gpusPerNode"
    ppn = _processes_per_node(common.processes_per_node, canonical, gpus, gpu_source)
    azureml = None
    kubernetes = None
    if engine == "azureml":
        if common.azureml is None:
            raise ClusterSpecError(
                'engine "azureml" needs an "azureml" section: {"subscriptionId", '
                '"resourceGroup", "workspace"}'
            )
        azureml = azureml_spec(common.azureml, name)
    elif common.azureml is not None:
        azureml = azureml_spec(common.azureml, name)
    if engine == "kubernetes" and common.kubernetes is None:
        raise ClusterSpecError(
            'engine "kubernetes" needs a "kubernetes" section with at least "image" '
            "(the container image that has landcover installed)"
        )
    if common.kubernetes is not None:
        kubernetes = kubernetes_spec(common.kubernetes)
    network = None
    if common.network is not None:
        network = network_shape(common.network)
        if engine == "slurm":
            notes = (
                *notes,
                "network: a SLURM cluster's links are its own, so the slurm engine ignores it; "
                "the local SLURM testbed takes the rate when it starts "
                "(python -m cluster.testbed up --bandwidth RATE)",
            )
        elif engine != "local":
            notes = (*notes, f"network is emulated by the local engine only: {engine} ignores it")
    if dask is not None and engine != "dask":
        notes = (*notes, f'the "dask" section is for engine "dask": {engine} ignores it')
    data = DataSpec(common.data.url, common.data.mode, common.data.account_name)
    if data.url is not None and not data.url.strip():
        raise ClusterSpecError('data.url is empty: give the chip store URL or drop "url"')
    return ClusterSpec(
        name=name,
        engine=engine,
        vm_size=canonical,
        node_count=target,
        processes_per_node=ppn,
        gpus_per_node=gpus,
        vcpus_per_node=vcpus,
        vm_priority=_priority(priority),
        elastic=elastic,
        data=data,
        mounts=mounts,
        setup_command=setup_command,
        azureml=azureml,
        kubernetes=kubernetes,
        slurm=slurm,
        dask=dask,
        network=network,
        notes=notes,
        secret_values=secrets,
    )


def _vm(vm_size: str, engine: str, *, here: bool = True) -> tuple[str, int | None, int | None]:
    """(canonical name, GPUs per node, vCPUs per node) of a VM size; None where unknown.
    `here`: the nodes are this machine (not a Dask scheduler's workers)."""
    if vm_size.lower() == LOCAL:
        # no size given: the partition's (or the scheduler's) nodes, GPUs only if asked for
        if engine == "slurm" or not here:
            return LOCAL, 0, None
        if not engine_info(engine).local_vm:
            raise ClusterSpecError(
                f'vmSize "local" names this machine; engine "{engine}" needs an Azure VM size '
                'such as "Standard_NC6s_v3" (GPU) or "Standard_D4s_v3" (CPU)'
            )
        return LOCAL, local_gpu_count(), local_cpu_count()
    size = lookup_vm_size(vm_size)
    if size is None:
        return vm_size, None, None
    return size.name, size.gpus, size.vcpus


def _processes_per_node(value: int | str, vm_size: str, gpus: int | None, gpu_source: str) -> int:
    if value == "auto":
        if gpus is None:
            close = difflib.get_close_matches(vm_size, known_vm_sizes(), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ClusterSpecError(
                f"vmSize {vm_size!r} is not in the VM size table{hint}, so processesPerNode "
                '"auto" cannot know its GPUs: set processesPerNode to the GPUs per node '
                "(1 on a CPU size) or use a known size"
            )
        return max(1, gpus)
    assert isinstance(value, int)  # pydantic allowed only "auto" or an int
    if gpus and value > gpus:
        raise ClusterSpecError(
            f"processesPerNode {value} exceeds the {gpus} GPU(s) of {gpu_source}: "
            'use one process per GPU ("auto")'
        )
    return value
