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

Each engine's section is read, checked and documented by the engine itself
(`cluster.engines` finds its `EngineRules`): `azureml` in `cluster.azureml.section`,
`kubernetes` in `cluster.kubernetes.section`, `slurm` in `cluster.slurm.section`, `dask` in
`cluster.dask.section`, and `network` (the local engine's emulated links) in
`cluster.local.section`. This module reads the common part and asks the engine's rules for the
rest: its section's default, whether it restarts (`elastic`), its nodes' GPUs, and the notes
for sections it ignores.

Legacy form (the original Batch AI tutorial's cluster.json)::

    {"properties": {"vmSize": "STANDARD_NC6", "vmPriority": "dedicated",
                    "scaleSettings": {"manual": {"targetNodeCount": 2}},
                    "nodeSetup": {"mountVolumes": {"azureBlobFileSystems": [...]},
                                  "setupTask": {"commandLine": "..."}}}}

It may carry the flat keys that Batch AI had no word for (`name`, `engine`, `processesPerNode`,
`elastic`, `data`, `azureml`, `kubernetes`) beside `properties`. Mapping:
`scaleSettings.manual.targetNodeCount` is `targetNodeCount`; `scaleSettings.autoScale` becomes an
elastic job that asks for `maximumNodeCount` nodes and runs on as few as
max(1, `minimumNodeCount`) (`initialNodeCount` is checked, then unused: Azure ML compute scales
from zero); `azureBlobFileSystems` become `mounts`; `setupTask.commandLine` becomes
`setupCommand`. Credentials in the file are collected only so that they can be redacted: no
engine copies an account key into a job definition. Both forms give the same `ClusterSpec`.

`elastic.maxRestarts` defaults to 3 when an `elastic` block (or autoScale) is present and to 0
otherwise; `minNodes`/`maxNodes` default to `targetNodeCount`.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cluster.engines import ENGINES, engine_info, engine_rules
from cluster.errors import ClusterSpecError
from cluster.redact import Redactor, collect_secret_values
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
    validate_document,
)
from cluster.vmsizes import LOCAL, known_vm_sizes, lookup_vm_size
from tiling.runtime.jsontext import parse_json
from tiling.runtime.machine import local_cpu_count, local_gpu_count

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
    data = parse_json(
        text,
        where=source,
        fix="fix the syntax (trailing commas and comments are not JSON)",
        error=ClusterSpecError,
    )
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
    info = engine_info(engine)
    rules = engine_rules(engine)
    sections = _sections(common, engine, name)
    own = sections.get(info.section) if info.section else None
    canonical, gpus, vcpus = _vm(vm_size, engine, here=rules.nodes_here(own))
    gpu_source = canonical
    if not info.elastic_restarts and elastic is not None:
        raise ClusterSpecError(rules.no_elastic or f'engine "{engine}" has no elastic restarts')
    own_gpus = rules.gpus_per_node(common.engine_section(info.section) if info.section else None)
    if own_gpus is not None:
        gpus, gpu_source = own_gpus, f"{info.section}.gpusPerNode"
    ppn = _processes_per_node(common.processes_per_node, canonical, gpus, gpu_source)
    if info.needs_section and own is None:
        raise ClusterSpecError(
            rules.missing or f'engine "{engine}" needs a "{info.section}" section'
        )
    notes = (*notes, *_ignored_notes(sections, engine))
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
        section=own,
        notes=notes,
        secret_values=secrets,
    )


def _sections(common: CommonSection, engine: str, name: str) -> dict[str, Any]:
    """Every engine section, checked by its engine's rules: those given, and the running
    engine's own (its default when absent), keyed by their cluster.json key. Only the running
    engine's own is kept (`ClusterSpec.section`); the others are checked all the same (a bad
    section is an error whichever engine runs) and noted as ignored."""
    checked: dict[str, Any] = {}
    for other in ENGINES.values():
        if other.section is None:
            continue
        raw = common.engine_section(other.section)
        if raw is not None or other.name == engine:
            checked[other.section] = engine_rules(other.name).section(raw, name=name)
    return checked


def _ignored_notes(sections: Mapping[str, Any], engine: str) -> list[str]:
    """A note for each section given that the running engine ignores: the engine's own word
    on it, else the section's owner's."""
    rules = engine_rules(engine)
    notes = []
    for other in ENGINES.values():
        key = other.section
        if other.name == engine or key is None or sections.get(key) is None:
            continue
        note = rules.note_on(key) or engine_rules(other.name).ignored(engine)
        if note is not None:
            notes.append(note)
    return notes


def _vm(vm_size: str, engine: str, *, here: bool = True) -> tuple[str, int | None, int | None]:
    """(canonical name, GPUs per node, vCPUs per node) of a VM size; None where unknown.
    `here`: `vmSize "local"` is this machine (not the nodes a cluster gives, such as a SLURM
    partition's or a Dask scheduler's workers)."""
    if vm_size.lower() == LOCAL:
        if not engine_info(engine).local_vm:
            raise ClusterSpecError(
                f'vmSize "local" names this machine; engine "{engine}" needs an Azure VM size '
                'such as "Standard_NC6s_v3" (GPU) or "Standard_D4s_v3" (CPU)'
            )
        if not here:  # no size given: the cluster's nodes, GPUs only if asked for
            return LOCAL, 0, None
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
