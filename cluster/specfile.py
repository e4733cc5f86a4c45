"""cluster.json as written: the flat form and the legacy Batch AI form as pydantic models,
and pydantic's errors turned into one line that names the field and the fix.

`cluster.clusterjson` turns a validated document into a `ClusterSpec`; the field meanings are
documented there. Unknown keys are refused in the flat form (a misspelt key is reported with
the closest known one); Batch AI sections accept keys we do not use, which become notes.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, StrictStr, ValidationError, create_model

from cluster.engines import ENGINES, engine_rules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel as _Model
from cluster.jsonmodel import LenientModel as _LenientModel
from cluster.jsonmodel import NonNegativeInt, PositiveInt
from cluster.vmsizes import LOCAL

DataMode = Literal["mount", "direct"]
DEFAULT_ELASTIC_RESTARTS = 3
if TYPE_CHECKING:
    EngineName = str
else:  # the registry's engines, in its order
    EngineName = Literal[tuple(ENGINES)]


def validate_document(data: Any) -> FlatFile | LegacyFile:
    """The document as the form it is in (legacy when it has `properties`); one-line errors
    (without the file name, which the caller adds)."""
    legacy = "properties" in data
    try:
        return (LegacyFile if legacy else FlatFile).model_validate(data)
    except ValidationError as exc:
        raise ClusterSpecError(one_line(exc, legacy=legacy)) from None


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


def _section_models() -> dict[str, type[BaseModel]]:
    """Each engine's cluster.json section, by key, in the registry's order."""
    models = {info.section: engine_rules(info.name).model for info in ENGINES.values()}
    return {key: model for key, model in models.items() if key is not None and model is not None}


SECTION_MODELS = _section_models()


class _Common(_Model):
    name: StrictStr = "landcover"
    engine: EngineName = "local"
    processes_per_node: Literal["auto"] | PositiveInt = "auto"
    elastic: ElasticSection | None = None
    data: DataSection = Field(default_factory=DataSection)

    def engine_section(self, key: str) -> Any:
        """The section `key` as written (None: absent)."""
        return getattr(self, key)


if TYPE_CHECKING:
    CommonSection = _Common
else:  # plus one optional field per engine section
    CommonSection = create_model(
        "CommonSection",
        __base__=_Common,
        __module__=__name__,
        **{key: (model | None, None) for key, model in SECTION_MODELS.items()},
    )


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
        *(f.alias or n for m in SECTION_MODELS.values() for n, f in m.model_fields.items()),
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
