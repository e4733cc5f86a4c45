"""The engine sections of cluster.json (`azureml`, `kubernetes`, `slurm`) and its `network`,
each checked and turned into its spec; `cluster.clusterjson` reads the file around them."""

from __future__ import annotations

import re
import shlex
from decimal import Decimal

from cluster.errors import ClusterSpecError
from cluster.netns import LinkShape, parse_duration_s, parse_rate
from cluster.spec import AzureMLSpec, KubernetesSpec, SlurmSpec
from cluster.specfile import AzureMLSection, KubernetesSection, NetworkSection, SlurmSection

__all__ = [
    "azureml_spec",
    "kubernetes_name",
    "kubernetes_quantity",
    "kubernetes_spec",
    "network_shape",
    "slurm_spec",
]

_COMPUTE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{1,15}$")  # Azure ML: 2-16 characters
# a registered environment: [azureml:]name:version, [azureml:]name@latest, or a registry asset id
_ENVIRONMENT_RE = re.compile(
    r"^(?:(?:azureml:)?[A-Za-z0-9][A-Za-z0-9_.-]*(?::[A-Za-z0-9_.-]+|@latest)|azureml://\S+)$"
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Azure ML's experiment names: letters, digits, '_' and '-', starting with a letter or digit
_EXPERIMENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,254}$")

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


def network_shape(raw: NetworkSection) -> LinkShape:
    rate = None if raw.bandwidth is None else parse_rate(raw.bandwidth)
    delay = None if raw.latency is None else parse_duration_s(raw.latency)
    return LinkShape(rate_bits_per_s=rate, delay_s=delay or None)


def azureml_spec(raw: AzureMLSection, name: str) -> AzureMLSpec:
    compute = raw.compute_name or name[:16].rstrip("-")
    if not _COMPUTE_NAME_RE.match(compute):
        raise ClusterSpecError(
            f"azureml.computeName {compute!r} must be 2-16 letters, digits or hyphens starting "
            "with a letter (Azure ML's rule); set azureml.computeName"
        )
    choices = _environment_choices(raw)
    for key, value in choices:
        if value is not None and not value.strip():
            raise ClusterSpecError(f'azureml.{key} is empty: give a value or drop "{key}"')
    given = [key for key, value in choices if value is not None]
    if len(given) > 1:
        raise ClusterSpecError(
            f"azureml.{given[0]} and azureml.{given[1]} both choose the job's environment: keep "
            "one (image: a container with the project installed; environment: a registered "
            "environment; baseImage: the base of the environment the plan builds)"
        )
    if not _EXPERIMENT_NAME_RE.match(raw.experiment_name):
        raise ClusterSpecError(
            f"azureml.experimentName {raw.experiment_name!r} must be 1-255 letters, digits, '_' "
            "or '-', starting with a letter or digit (Azure ML's rule), e.g. \"landcover\""
        )
    if raw.environment is not None and not _ENVIRONMENT_RE.match(raw.environment):
        raise ClusterSpecError(
            f"azureml.environment {raw.environment!r} must name a registered environment as "
            '"name:version" or "name@latest" (or an azureml:// registry asset id)'
        )
    return AzureMLSpec(
        subscription_id=raw.subscription_id,
        resource_group=raw.resource_group,
        workspace=raw.workspace,
        image=raw.image,
        environment=raw.environment,
        base_image=raw.base_image,
        compute_name=compute,
        experiment_name=raw.experiment_name,
        idle_seconds_before_scale_down=raw.idle_seconds_before_scale_down,
        code=raw.code,
    )


def _environment_choices(raw: AzureMLSection) -> tuple[tuple[str, str | None], ...]:
    """The keys that choose an Azure ML job's environment, as written, with their values."""
    return (("image", raw.image), ("environment", raw.environment), ("baseImage", raw.base_image))


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
    return KubernetesSpec(
        image=raw.image,
        api=raw.api,
        runtime=raw.runtime,
        runtime_kind=raw.runtime_kind,
        namespace=raw.namespace,
        image_pull_policy=raw.image_pull_policy,
        storage_secret=raw.storage_secret,
        storage_secret_keys=None if keys is None else tuple(keys),
        cpu=cpu,
        memory=raw.memory,
    )


def slurm_spec(raw: SlurmSection) -> SlurmSpec:
    for index, directive in enumerate(raw.extra_directives):
        try:  # sbatch reads an #SBATCH line as a shell reads words: quotes must pair
            shlex.split(directive, comments=True)
        except ValueError:
            raise ClusterSpecError(
                f"slurm.extraDirectives[{index}] {directive!r} has an unmatched quote, which "
                "sbatch refuses: close it or drop the quote"
            ) from None
    return SlurmSpec(
        partition=raw.partition,
        account=raw.account,
        time_limit=raw.time_limit,
        cpus_per_task=raw.cpus_per_task,
        setup=tuple(raw.setup),
        extra_directives=tuple(raw.extra_directives),
        socket_interface=raw.socket_interface,
    )
