"""Validate a manifest against a CustomResourceDefinition's openAPIV3Schema, as the API server
does for a structural schema with strict field validation, so a manifest is checked field by
field without a cluster.

Covered: `type` (and `x-kubernetes-int-or-string`), `format` int32/int64 ranges, `required`,
`properties` (a field the schema does not name is an error, unless
`x-kubernetes-preserve-unknown-fields`), `additionalProperties`, `enum`, `items`, `anyOf`,
`minimum`/`maximum`, `minLength`/`maxLength`, `maxItems`/`minItems`, `minProperties`,
`pattern`, and `x-kubernetes-list-type` map/set uniqueness. Not covered: the CEL rules
(`x-kubernetes-validations`) and the admission webhooks — tests check the ones that matter by
hand — and `metadata`, which the API server validates as ObjectMeta.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

KUBEFLOW_DATA = Path(__file__).resolve().parents[1] / "data" / "kubeflow"
TRAINJOB_CRD = KUBEFLOW_DATA / "trainer.kubeflow.org_trainjobs.yaml"
PYTORCHJOB_CRD = KUBEFLOW_DATA / "kubeflow.org_pytorchjobs.yaml"

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser: 0.1 s, not 1.5 s


@functools.cache
def crd_schema(path: Path, api_version: str) -> Mapping[str, Any]:
    """The openAPIV3Schema that the CRD in `path` serves for `api_version` (group/version)."""
    with path.open(encoding="utf-8") as f:
        (crd,) = [d for d in yaml.load_all(f, Loader=_Loader) if d]
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group, f"{path.name} is for {crd['spec']['group']}"
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served["served"]:
            return served["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]
    raise AssertionError(f"{path.name} serves no version {version}")


def crd_errors(crd_path: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Every way `manifest` breaks the schema of its apiVersion in the CRD, one line each."""
    schema = crd_schema(crd_path, str(manifest.get("apiVersion")))
    errors: list[str] = []
    body = {k: v for k, v in manifest.items() if k != "metadata"}
    _check(body, schema, "", errors)
    return errors


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    raise AssertionError(f"schema type {kind!r} is not handled")


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    where = path or "(root)"
    if schema.get("x-kubernetes-int-or-string"):
        if not (_type_ok(value, "integer") or isinstance(value, str)):
            errors.append(f"{where}: must be an integer or a string, got {value!r}")
            return
    elif "type" in schema and not _type_ok(value, schema["type"]):
        errors.append(f"{where}: must be of type {schema['type']}, got {value!r}")
        return
    if "anyOf" in schema:
        branches = []
        for branch in schema["anyOf"]:
            found: list[str] = []
            _check(value, branch, path, found)
            branches.append(found)
        if all(branches):
            errors.append(f"{where}: matches none of anyOf ({branches[0][0]})")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: must be one of {schema['enum']}, got {value!r}")
    _check_bounds(value, schema, where, errors)
    if isinstance(value, Mapping):
        _check_object(value, schema, path, errors)
    elif isinstance(value, list):
        _check_array(value, schema, path, errors)


def _check_bounds(value: Any, schema: Mapping[str, Any], where: str, errors: list[str]) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = _INT_RANGES.get(schema.get("format", ""), (None, None))
        low = schema.get("minimum", low)
        high = schema.get("maximum", high)
        if (low is not None and value < low) or (high is not None and value > high):
            errors.append(f"{where}: {value} is outside {low}..{high}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {schema['pattern']}")


def _check_object(
    value: Mapping[str, Any], schema: Mapping[str, Any], path: str, errors: list[str]
) -> None:
    prefix = f"{path}." if path else ""
    where = path or "(root)"
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"{prefix}{name}: required")
    if len(value) < schema.get("minProperties", 0):
        errors.append(f"{where}: needs at least {schema['minProperties']} field(s)")
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if properties is not None and key in properties:
            _check(item, properties[key], f"{prefix}{key}", errors)
        elif isinstance(extra, Mapping):
            _check(item, extra, f"{prefix}{key}", errors)
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            errors.append(f"{prefix}{key}: unknown field (not in the schema of {where})")


def _check_array(value: list[Any], schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    where = path or "(root)"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{where}: more than {schema['maxItems']} items")
    if len(value) < schema.get("minItems", 0):
        errors.append(f"{where}: fewer than {schema['minItems']} items")
    items = schema.get("items")
    if items is not None:
        for i, item in enumerate(value):
            _check(item, items, f"{path}[{i}]", errors)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "map":
        keys = schema["x-kubernetes-list-map-keys"]
        seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, Mapping)]
        if len(set(seen)) != len(seen):
            errors.append(f"{where}: two items share the key {'/'.join(keys)}")
    elif list_type == "set" and len({repr(v) for v in value}) != len(value):
        errors.append(f"{where}: items must be unique (a set)")
