"""The `kubernetes` section of cluster.json: the image, runtime and resources of a Kubeflow
job, and the checks of the kubernetes engine.

    "kubernetes": {"api": "trainjob", "runtime": "torch-distributed",
                   "runtimeKind": "ClusterTrainingRuntime", "namespace": "default",
                   "image": "...", "imagePullPolicy": "IfNotPresent",
                   "storageSecret": "chips-storage",
                   "storageSecretKeys": ["AZURE_STORAGE_ACCOUNT_KEY"],
                   "cpu": "4", "memory": "16Gi"}

`api` is "trainjob" (Kubeflow Trainer v2, the default: `runtime` names the
ClusterTrainingRuntime, or with `runtimeKind` "TrainingRuntime" the namespaced runtime, that it
runs on) or "pytorchjob" (the training operator's v1 PyTorchJob). `storageSecretKeys` (TrainJob
only) lists the keys of `storageSecret` given to the pods; by default the usual storage
variables, each optional. Names and quantities are checked as the API server checks them:
`namespace` a DNS-1123 label, `runtime` and `storageSecret` DNS-1123 subdomains, `cpu` and
`memory` positive resource quantities ("4", "500m", "16Gi").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from pydantic import StrictInt, StrictStr

from cluster.engines import EngineRules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel

KubernetesApi = Literal["trainjob", "pytorchjob"]
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Kubernetes names as the API server checks them (apimachinery's validation): a namespace is
# a DNS-1123 label, other objects' names (Secret, ClusterTrainingRuntime) DNS-1123 subdomains
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_RE = re.compile(rf"^{_DNS1123_LABEL}$")
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1123_LABEL_MAX = 63
_DNS1123_SUBDOMAIN_MAX = 253
# A resource quantity (apimachinery's resource.ParseQuantity): a signed decimal number, then a
# binary (Ki..Ei) or decimal (n, u, m, k, M..E) SI suffix or an integer exponent (e3, E-2)
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY_SI = {f"{prefix}i": Decimal(1024) ** (n + 1) for n, prefix in enumerate("KMGTPE")}
_DECIMAL_SI = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
}  # fmt: skip


class KubernetesSection(JsonModel):
    """cluster.json's `kubernetes` object, as written."""

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


@dataclass(frozen=True, slots=True)
class KubernetesSpec:
    """Kubeflow settings: `api` picks a Trainer v2 TrainJob (on the ClusterTrainingRuntime or
    TrainingRuntime `runtime`) or a v1 PyTorchJob. `storage_secret` names a Secret the pods read
    their storage credentials from: all of it (PyTorchJob) or its `storage_secret_keys`
    (TrainJob: Trainer v2 takes environment variables one by one)."""

    image: str
    api: KubernetesApi = "trainjob"
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    namespace: str = "default"
    image_pull_policy: str | None = None  # None: the cluster's default for the image's tag
    storage_secret: str | None = None
    storage_secret_keys: tuple[str, ...] | None = None  # None: the usual storage variables
    cpu: str | None = None
    memory: str | None = None


def kubernetes_quantity(text: str, field: str) -> Decimal:
    """A Kubernetes resource quantity ("4", "500m", "16Gi", "1.5e3") as a number, refused in
    one line unless it is one and positive. `field` names it (e.g. `kubernetes.cpu`)."""
    match = _QUANTITY_RE.match(text)
    example = '"16Gi" or "512Mi"' if field.endswith("memory") else '"4" or "500m"'
    if match is None:
        raise ClusterSpecError(
            f"{field} {text!r} is not a Kubernetes quantity: write a number with an optional "
            f"suffix (Ki, Mi, Gi, ... or m, k, M, G, ...), e.g. {example}"
        )
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E"):
        scale = Decimal(10) ** int(suffix[1:])
    else:
        scale = _BINARY_SI.get(suffix) or _DECIMAL_SI[suffix]
    value = Decimal(match["number"]) * scale
    if value <= 0:
        raise ClusterSpecError(f"{field} {text!r} must be positive, e.g. {example}")
    if field.endswith("memory") and suffix == "m":  # millibytes: a typo for Mi or M
        raise ClusterSpecError(
            f"{field} {text!r} is {value} bytes ('m' is milli): write "
            f"{match['number']}Mi or {match['number']}M"
        )
    return value


def kubernetes_name(value: str, field: str, *, label: bool = False) -> str:
    """`value` if the API server takes it as an object name: a DNS-1123 label (a namespace;
    `label`) or subdomain (a Secret, a runtime); else one line naming `field` and the rule."""
    pattern, most = (
        (_DNS1123_LABEL_RE, _DNS1123_LABEL_MAX)
        if label
        else (_DNS1123_SUBDOMAIN_RE, _DNS1123_SUBDOMAIN_MAX)
    )
    if not pattern.match(value) or len(value) > most:
        dots = "" if label else " (and '.' between such parts)"
        raise ClusterSpecError(
            f"{field} {value!r} is not a Kubernetes name: use lower-case letters, digits and "
            f"'-'{dots}, starting and ending with a letter or digit, at most {most} characters"
        )
    return value


def kubernetes_spec(raw: KubernetesSection) -> KubernetesSpec:
    """The checked section; one-line errors."""
    kubernetes_name(raw.namespace, "kubernetes.namespace", label=True)
    kubernetes_name(raw.runtime, "kubernetes.runtime")
    if raw.storage_secret is not None:
        kubernetes_name(raw.storage_secret, "kubernetes.storageSecret")
    if not raw.image.strip() or any(c.isspace() for c in raw.image):
        raise ClusterSpecError(
            f"kubernetes.image {raw.image!r} is not an image reference: give one without "
            'spaces, e.g. "myregistry.azurecr.io/landcover:1"'
        )
    cpu = None if raw.cpu is None else str(raw.cpu)
    for field, quantity in (("cpu", cpu), ("memory", raw.memory)):
        if quantity is not None:
            kubernetes_quantity(quantity, f"kubernetes.{field}")
    keys = raw.storage_secret_keys
    if keys is not None:
        bad = [k for k in keys if not _ENV_NAME_RE.match(k)]
        if bad or not keys:
            raise ClusterSpecError(
                f"kubernetes.storageSecretKeys must list environment variable names "
                f"(letters, digits, '_'), got {bad[0] if bad else keys!r}"
            )
        if raw.storage_secret is None:
            raise ClusterSpecError(
                "kubernetes.storageSecretKeys needs kubernetes.storageSecret (the Secret that "
                "holds those keys)"
            )
    storage_secret_keys = None if keys is None else tuple(keys)
    return raw.checked(KubernetesSpec, storage_secret_keys=storage_secret_keys, cpu=cpu)


class _KubernetesRules(EngineRules):
    model = KubernetesSection
    missing = (
        'engine "kubernetes" needs a "kubernetes" section with at least "image" '
        "(the container image that has landcover installed)"
    )

    def section(self, raw: KubernetesSection | None, *, name: str) -> KubernetesSpec | None:
        return None if raw is None else kubernetes_spec(raw)


RULES = _KubernetesRules()
