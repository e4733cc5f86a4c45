"""The `azureml` section of cluster.json: the Azure ML workspace, compute and environment a
job runs on, and the checks of the azureml engine.

    "azureml": {"subscriptionId": "...", "resourceGroup": "...", "workspace": "...",
                "computeName": "landcover", "experimentName": "landcover",
                "idleSecondsBeforeScaleDown": 1800, "code": ".",
                "baseImage": "pytorch/pytorch:...",  or one of
                "image": "myregistry.azurecr.io/landcover:latest",
                "environment": "landcover-env:3"}

By default the plan builds an environment from `baseImage` (a PyTorch image; the engine's
default when left out) plus the project's dependencies, and the job installs the uploaded
`code` (the project directory when left out); `image` (a container with the project
installed) or `environment` (a registered Azure ML environment, `name:version` or
`name@latest`) replace that build. At most one of `image`, `environment`, `baseImage`.
`experimentName` and `computeName` follow Azure ML's rules for names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import StrictStr

from cluster.engines import EngineRules
from cluster.errors import ClusterSpecError
from cluster.jsonmodel import JsonModel, NonNegativeInt

_COMPUTE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{1,15}$")  # Azure ML: 2-16 characters
# a registered environment: [azureml:]name:version, [azureml:]name@latest, or a registry asset id
_ENVIRONMENT_RE = re.compile(
    r"^(?:(?:azureml:)?[A-Za-z0-9][A-Za-z0-9_.-]*(?::[A-Za-z0-9_.-]+|@latest)|azureml://\S+)$"
)
# Azure ML's experiment names: letters, digits, '_' and '-', starting with a letter or digit
_EXPERIMENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,254}$")


class AzureMLSection(JsonModel):
    """cluster.json's `azureml` object, as written."""

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


@dataclass(frozen=True, slots=True)
class AzureMLSpec:
    """The `azureml` section. The job's environment is at most one of `image` (a container
    with the project installed), `environment` (a registered environment, `name:version`), and
    otherwise one the plan builds from `base_image` (None: the engine's default) plus the
    project's dependencies."""

    subscription_id: str
    resource_group: str
    workspace: str
    compute_name: str
    image: str | None = None
    environment: str | None = None
    base_image: str | None = None
    experiment_name: str = "landcover"
    idle_seconds_before_scale_down: int = 1800
    code: str | None = None


def azureml_spec(raw: AzureMLSection, name: str) -> AzureMLSpec:
    """The checked section of the spec named `name` (the default compute name); one-line
    errors."""
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
    return raw.checked(AzureMLSpec, compute_name=compute)


def _environment_choices(raw: AzureMLSection) -> tuple[tuple[str, str | None], ...]:
    """The keys that choose an Azure ML job's environment, as written, with their values."""
    return (("image", raw.image), ("environment", raw.environment), ("baseImage", raw.base_image))


class _AzureMLRules(EngineRules):
    model = AzureMLSection
    missing = (
        'engine "azureml" needs an "azureml" section: {"subscriptionId", '
        '"resourceGroup", "workspace"}'
    )

    def section(self, raw: AzureMLSection | None, *, name: str) -> AzureMLSpec | None:
        return None if raw is None else azureml_spec(raw, name)


RULES = _AzureMLRules()
