"""cluster.json as written: the flat form and the legacy Batch AI form as pydantic models,
and pydantic's errors turned into one line that names the field and the fix.

`cluster.clusterjson` turns a validated document into a `ClusterSpec`; the field meanings are
documented there. Unknown keys are refused in the flat form (a misspelt key is reported with
the closest known one); Batch AI sections accept keys we do not use, which become notes.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)
from pydantic.alias_generators import to_camel

from cluster.daskspec import DaskSection
from cluster.errors import ClusterSpecError
from cluster.vmsizes import LOCAL

EngineName = Literal["local", "azureml", "kubernetes", "slurm", "dask"]
DataMode = Literal["mount", "direct"]
KubernetesApi = Literal["trainjob", "pytorchjob"]
DEFAULT_ELASTIC_RESTARTS = 3


def validate_document(data: Any) -> FlatFile | LegacyFile:
    """The document as the form it is in (legacy when it has `properties`); one-line errors
    (without the file name, which the caller adds)."""
    legacy = "properties" in data
    try:
        return (LegacyFile if legacy else FlatFile).model_validate(data)
    except ValidationError as exc:
        raise ClusterSpecError(one_line(exc, legacy=legacy)) from None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)


class _LenientModel(BaseModel):
    """Batch AI sections: keys we do not use are allowed (reported as notes)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, frozen=True)


PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class ElasticSection(_Model):
    min_nodes: PositiveInt | None = None
    max_nodes: PositiveInt | None = None
    max_restarts: NonNegativeInt = DEFAULT_ELASTIC_RESTARTS


class DataSection(_Model):
    url: StrictStr | None = None
    mode: DataMode = "mount"
    account_name: StrictStr | None = None


class BlobMountSection(_LenientModel):
    account_name: StrictStr
    container_name: StrictStr
    relative_mount_path: StrictStr


class AzureMLSection(_Model):
    subscription_id: StrictStr
    resource_group: StrictStr
    workspace: StrictStr
    image: StrictStr | None = None
    environment: StrictStr | None = None
    base_image: StrictStr | None = None
    compute_name: StrictStr | None = None
    experiment_name: StrictStr = "landcover"
    idle_seconds_before_scale_down: NonNegativeInt = 1800
    code: StrictStr | None = None


class KubernetesSection(_Model):
    api: KubernetesApi = "trainjob"
    runtime: StrictStr = "torch-distributed"
    runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"
    image: StrictStr
    namespace: StrictStr = "default"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    storage_secret: StrictStr | None = None
    storage_secret_keys: list[StrictStr] | None = None
    cpu: StrictStr | StrictInt | None = None
    memory: StrictStr | None = None


# SLURM's time formats that name hours: "HH:MM:SS" and "D-HH:MM:SS" (days, hours)
_TIME_LIMIT = re.compile(r"^(?:\d+-)?\d{1,3}:[0-5]\d:[0-5]\d$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.,-]+$")  # a partition (or a comma list of them), account
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # a Linux interface name


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"must be {what}")
        return value

    return AfterValidator(check)


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value or not value.strip():
        raise ValueError("must be one non-empty line")
    return value


def _sbatch_option(value: str) -> str:
    if not value.strip().removeprefix("#SBATCH").strip().startswith("-"):
        raise ValueError('must be an sbatch option such as "--exclusive"')
    return value


OneLine = Annotated[StrictStr, AfterValidator(_one_line)]


class SlurmSection(_Model):
    partition: Annotated[StrictStr, _matching(_SLURM_NAME, "a SLURM partition name")] | None = None
    account: Annotated[StrictStr, _matching(_SLURM_NAME, "a SLURM account name")] | None = None
    time_limit: (
        Annotated[StrictStr, _matching(_TIME_LIMIT, '"HH:MM:SS" or "D-HH:MM:SS", e.g. "02:00:00"')]
        | None
    ) = None
    gpus_per_node: NonNegativeInt | None = None
    cpus_per_task: PositiveInt | None = None
    setup: list[OneLine] = Field(default_factory=list)
    extra_directives: list[Annotated[OneLine, AfterValidator(_sbatch_option)]] = Field(
        default_factory=list
    )
    socket_interface: (
        Annotated[StrictStr, _matching(_IFNAME, 'a network interface name such as "eth0"')] | None
    ) = None


class NetworkSection(_Model):
    bandwidth: StrictStr | None = None
    latency: StrictStr | None = None


class CommonSection(_Model):
    name: StrictStr = "landcover"
    engine: EngineName = "local"
    processes_per_node: Literal["auto"] | PositiveInt = "auto"
    elastic: ElasticSection | None = None
    data: DataSection = Field(default_factory=DataSection)
    azureml: AzureMLSection | None = None
    kubernetes: KubernetesSection | None = None
    slurm: SlurmSection | None = None
    dask: DaskSection | None = None
    network: NetworkSection | None = None


class FlatFile(CommonSection):
    vm_size: StrictStr = LOCAL
    vm_priority: StrictStr = "dedicated"
    target_node_count: PositiveInt
    mounts: list[BlobMountSection] = Field(default_factory=list)
    setup_command: StrictStr | None = None


class _Manual(_LenientModel):
    target_node_count: PositiveInt


class _AutoScale(_LenientModel):
    minimum_node_count: NonNegativeInt = 0
    maximum_node_count: PositiveInt
    initial_node_count: NonNegativeInt = 0


class _ScaleSettings(_Model):
    manual: _Manual | None = None
    auto_scale: _AutoScale | None = None


class _MountVolumes(_LenientModel):
    azure_blob_file_systems: list[BlobMountSection] = Field(default_factory=list)


class _SetupTask(_LenientModel):
    command_line: StrictStr


class _NodeSetup(_LenientModel):
    mount_volumes: _MountVolumes | None = None
    setup_task: _SetupTask | None = None


class _LegacyProperties(_LenientModel):
    vm_size: StrictStr
    vm_priority: StrictStr = "dedicated"
    scale_settings: _ScaleSettings
    node_setup: _NodeSetup | None = None


class LegacyFile(CommonSection):
    properties: _LegacyProperties
    location: StrictStr | None = None


_HINTS: dict[str, str] = {
    "targetNodeCount": 'set "targetNodeCount": N, the number of nodes (e.g. 2)',
    "vmSize": 'set "vmSize", e.g. "Standard_NC6s_v3", or "local" for this machine',
    "scaleSettings": 'add "scaleSettings": {"manual": {"targetNodeCount": 2}}',
    "subscriptionId": "copy it from the Azure portal (Subscriptions)",
    "resourceGroup": "give the resource group of the Azure ML workspace",
    "workspace": "give the Azure ML workspace name",
    "image": "give a container image that has landcover installed",
    "maximumNodeCount": 'add "maximumNodeCount": N',
    "accountName": "give the storage account name",
    "containerName": "give the blob container name",
    "relativeMountPath": "give the mount directory name",
    "commandLine": "give the setup command",
}

_KNOWN_KEYS = sorted(
    {
        *(f.alias or n for m in (FlatFile, LegacyFile) for n, f in m.model_fields.items()),
        *(f.alias or n for n, f in ElasticSection.model_fields.items()),
        *(f.alias or n for n, f in DataSection.model_fields.items()),
        *(f.alias or n for n, f in AzureMLSection.model_fields.items()),
        *(f.alias or n for n, f in KubernetesSection.model_fields.items()),
        *(f.alias or n for n, f in SlurmSection.model_fields.items()),
        *(f.alias or n for n, f in NetworkSection.model_fields.items()),
        *(f.alias or n for n, f in DaskSection.model_fields.items()),
        "manual",
        "autoScale",
    }
)


def one_line(exc: ValidationError, *, legacy: bool) -> str:
    """The first pydantic error as one line that names the field and the fix."""
    errors = exc.errors(include_url=False)
    # an unknown key is usually a misspelt one, and explains the "missing" error beside it
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"]]
    # unions report the branch tried ("processesPerNode.literal['auto']"): keep the field only
    loc = [p for p in loc if not p.startswith(("literal[", "constrained-", "int", "str"))]
    path = ".".join(loc).replace(".[", "[") or "(top level)"
    leaf = loc[-1] if loc else ""
    kind = err["type"]
    given = err.get("input")
    ctx = err.get("ctx") or {}
    if leaf == "processesPerNode":
        return f'{path} must be "auto" or a whole number >= 1, got {given!r}'
    if kind == "missing":
        hint = _HINTS.get(leaf, "add it")
        if legacy and leaf == "targetNodeCount":
            hint = 'set "scaleSettings": {"manual": {"targetNodeCount": N}}'
        return f"{path} is missing: {hint}"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(leaf, _KNOWN_KEYS, n=1, cutoff=0.7)
        if leaf in ("vmSize", "vmPriority", "targetNodeCount") and legacy:
            return f'unknown field {path!r}: in the legacy form it goes inside "properties"'
        fix = f"did you mean {close[0]!r}?" if close else "remove it or check the spelling"
        return f"unknown field {path!r}: {fix}"
    if kind == "literal_error":
        return f"{path} must be {ctx.get('expected', 'one of the allowed values')}, got {given!r}"
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        op = ">=" if kind == "greater_than_equal" else ">"
        return f"{path} must be {op} {bound}, got {given!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{path} must be a whole number, got {given!r}"
    if kind in ("string_type",):
        return f"{path} must be a string, got {given!r}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{path} must be a JSON object, got {given!r}"
    if kind == "list_type":
        return f"{path} must be a JSON list, got {given!r}"
    message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{path}: {message} (got {given!r})"
