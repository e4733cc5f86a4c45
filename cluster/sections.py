"""The engine sections of cluster.json (`azureml`, `kubernetes`, `slurm`) and its `network`,
each checked and turned into its spec; `cluster.clusterjson` reads the file around them."""

from __future__ import annotations

import re

from cluster.errors import ClusterSpecError
from cluster.netns import LinkShape, parse_duration_s, parse_rate
from cluster.spec import AzureMLSpec, KubernetesSpec, SlurmSpec
from cluster.specfile import AzureMLSection, KubernetesSection, NetworkSection, SlurmSection

__all__ = ["azureml_spec", "kubernetes_spec", "network_shape", "slurm_spec"]

_COMPUTE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{1,15}$")  # Azure ML: 2-16 characters
# a registered environment: [azureml:]name:version, [azureml:]name@latest, or a registry asset id
_ENVIRONMENT_RE = re.compile(
    r"^(?:(?:azureml:)?[A-Za-z0-9][A-Za-z0-9_.-]*(?::[A-Za-z0-9_.-]+|@latest)|azureml://\S+)$"
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def kubernetes_spec(raw: KubernetesSection) -> KubernetesSpec:
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
        cpu=None if raw.cpu is None else str(raw.cpu),
        memory=raw.memory,
    )


def slurm_spec(raw: SlurmSection) -> SlurmSpec:
    return SlurmSpec(
        partition=raw.partition,
        account=raw.account,
        time_limit=raw.time_limit,
        cpus_per_task=raw.cpus_per_task,
        setup=tuple(raw.setup),
        extra_directives=tuple(raw.extra_directives),
        socket_interface=raw.socket_interface,
    )
