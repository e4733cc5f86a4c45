"""What an Azure ML job uses besides its compute: its environment, its code and its data inputs.

The environment is one of three, chosen by cluster.json's `azureml` section:

- built (the default): a Docker build context the plan writes, `environment/` — a Dockerfile
  `FROM baseImage` (a PyTorch image, `DEFAULT_BASE_IMAGE` unless given) that pip-installs
  `requirements.txt`: the project's `[project] dependencies` read from its pyproject.toml, its
  `[build-system] requires`, and MLflow for Azure ML's run metrics. torch and torchvision are
  the base image's: a script run during the build checks the image's Python against
  `requires-python`, finds both packages, and pins them to the image's own builds as pip
  constraints, so no requirement can swap the image's CUDA build for a wheel from PyPI. A
  Docker context, not `image` + `conda_file`: Azure ML builds a conda file into a new conda
  environment, which would not see the base image's PyTorch;
- `environment`: a registered Azure ML environment (`name:version`), e.g. one registered from
  the plan's environment.yaml;
- `image`: a container that already has the project installed (nothing is installed).

For the first two the project directory (`azureml.code`, else the directory holding the entry
module's top package) is the job's `code`: Azure ML uploads it (leaving out what `.amlignore`,
else `.gitignore`, names) and makes it the working directory, and the command installs it
(`pip install --no-deps --no-build-isolation -e .`) before running the entry module. Azure ML
starts the command once per process, so the processes of a node take turns (`flock`).

A job's inputs (the chip store) become Azure ML `uri_folder` paths (`input_path_for`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.azureml.section import AzureMLSpec
from cluster.errors import ClusterError
from cluster.spec import ClusterSpec
from tiling.runtime.urls import is_local

# PyTorch's own image: Python 3.11 with torch 2.6.0 + torchvision 0.21.0 built for CUDA 12.4
# (pyproject's floor: below torch 2.6 weights_only loading can be bypassed).
# Not an Azure ML curated ACPT image (mcr.microsoft.com/azureml/curated/acpt-pytorch-*): their
# PyTorch environment is Python 3.10, and the project needs 3.11 (requires-python; zarr 3).
DEFAULT_BASE_IMAGE = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime"
# what the base image provides and the build must not reinstall (CUDA builds)
BASE_IMAGE_PACKAGES = ("torch", "torchvision")
# Azure ML records a run's metrics from MLflow (azureml-mlflow is its tracking plugin;
# mlflow-skinny, the tracking client without the server stack, is what it depends on). In the
# environment only, for a tracking hook: the project itself does not depend on MLflow.
TRACKING_REQUIREMENTS = ("azureml-mlflow", "mlflow-skinny")
ENVIRONMENT_SCHEMA = "https://azuremlschemas.azureedge.net/latest/environment.schema.json"
CONTEXT_DIR = "environment"  # the build context, beside job.yaml and environment.yaml

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_MINIMUM_PYTHON = re.compile(r"^\s*>=\s*(\d+)\.(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Project:
    """What a pyproject.toml says that the environment needs."""

    root: Path
    name: str
    version: str | None
    dependencies: tuple[str, ...]
    build_requires: tuple[str, ...]
    minimum_python: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class JobEnvironment:
    """The job document's `environment` (and `code`), the command's install step, and for a
    built environment its build context (file name → text) and environment.yaml document."""

    job_value: str | Mapping[str, Any]
    description: str
    code: str | None = None
    install_command: str | None = None
    context: Mapping[str, str] = field(default_factory=dict)
    document: Mapping[str, Any] | None = None


def plan_environment(aml: AzureMLSpec, entry_module: str) -> JobEnvironment:
    """The environment and code of a job of `entry_module` under this `azureml` section."""
    if aml.image is not None:
        code = str(Path(aml.code).resolve()) if aml.code is not None else None
        return JobEnvironment({"image": aml.image}, f"image {aml.image}", code=code)
    project = read_project(project_root(aml.code, entry_module))
    install = (
        f"flock /tmp/{project.name}-install.lock "
        "python -m pip install --quiet --no-deps --no-build-isolation -e ."
    )
    if aml.environment is not None:
        reference = aml.environment
        if not reference.startswith("azureml:"):
            reference = f"azureml:{reference}"
        return JobEnvironment(
            reference,
            f"registered environment {aml.environment}",
            code=str(project.root),
            install_command=install,
        )
    base_image = aml.base_image or DEFAULT_BASE_IMAGE
    context = build_context(project, base_image)
    return JobEnvironment(
        {"build": {"path": CONTEXT_DIR}},
        f"built from {base_image} + the {len(project.dependencies)} dependencies in "
        f"{project.name}'s pyproject.toml ({CONTEXT_DIR}/, environment.yaml)",
        code=str(project.root),
        install_command=install,
        context=context,
        document=environment_document(project, base_image, context_version(context)),
    )


def project_root(code: str | None, entry_module: str) -> Path:
    """The directory uploaded as the job's code: `code`, else the directory that holds the
    entry module's top package (a source checkout or an editable install)."""
    if code is not None:
        root = Path(code).resolve()
        if not (root / "pyproject.toml").is_file():
            raise ClusterError(
                f"azureml.code {code}: no pyproject.toml there, so the job can neither install "
                "it nor build its environment; point azureml.code at the project directory, or "
                "set azureml.image to a container that has the project installed"
            )
        return root
    top = entry_module.partition(".")[0]
    spec = importlib.util.find_spec(top)
    places = list(spec.submodule_search_locations or []) if spec else []
    if spec is not None and spec.origin and not places:
        places = [str(Path(spec.origin).parent / "_")]  # a top-level module file
    for place in places:
        root = Path(place).resolve().parent
        if (root / "pyproject.toml").is_file():
            return root
    raise ClusterError(
        f"no pyproject.toml beside the {top!r} package ({', '.join(places) or 'not found'}): "
        "Azure ML uploads the project directory; set azureml.code to it (a source checkout), "
        "or azureml.image to a container that has the project installed"
    )


def read_project(root: Path) -> Project:
    """The name, dependencies and build requirements in root/pyproject.toml."""
    path = root / "pyproject.toml"
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ClusterError(f"{path}: cannot read it ({exc}); fix the file") from None
    table = document.get("project")
    if not isinstance(table, dict) or not isinstance(table.get("name"), str):
        raise ClusterError(f"{path}: no [project] table with a name; add one (PEP 621)")
    if "dependencies" in table.get("dynamic", []):
        raise ClusterError(
            f"{path}: [project] dependencies are dynamic, so the plan cannot read them; list "
            "them in pyproject.toml or set azureml.image / azureml.environment"
        )
    build_system = document.get("build-system", {})
    minimum = _MINIMUM_PYTHON.match(str(table.get("requires-python", "")))
    return Project(
        root=root,
        name=table["name"],
        version=table.get("version"),
        dependencies=tuple(str(d) for d in table.get("dependencies", [])),
        build_requires=tuple(str(r) for r in build_system.get("requires", [])),
        minimum_python=(int(minimum[1]), int(minimum[2])) if minimum else None,
    )


def requirement_name(requirement: str) -> str:
    """A PEP 508 requirement's distribution name, normalised (PEP 503)."""
    match = _NAME.match(requirement)
    if match is None:
        raise ClusterError(f"{requirement!r} is not a requirement; fix pyproject.toml")
    return re.sub(r"[-_.]+", "-", match[1]).lower()


def requirements_text(project: Project) -> str:
    """requirements.txt: the project's dependencies, its build requirements (the job installs
    the code without build isolation) and the tracking client."""
    from_base = [d for d in project.dependencies if requirement_name(d) in BASE_IMAGE_PACKAGES]
    lines = [
        f"# {project.name}: [project] dependencies of pyproject.toml "
        f"({', '.join(from_base) or 'none'} satisfied by the base image's own builds)",
        *project.dependencies,
        "# [build-system] requires: the job installs the uploaded code with --no-build-isolation",
        *project.build_requires,
        "# MLflow: Azure ML shows the metrics a run logs through it (not a project dependency)",
        *TRACKING_REQUIREMENTS,
    ]
    return "\n".join(lines) + "\n"


def build_context(project: Project, base_image: str) -> dict[str, str]:
    """The Docker build context: Dockerfile, requirements.txt, base_constraints.py."""
    work = f"/tmp/{project.name}-environment"
    dockerfile = f"""\
# {project.name}'s Azure ML environment: Python, CUDA, torch and torchvision from the base
# image; the project's dependencies (requirements.txt, from pyproject.toml) on top, with the
# base image's torch and torchvision pinned so that pip never replaces them.
FROM {base_image}
COPY requirements.txt base_constraints.py {work}/
RUN python {work}/base_constraints.py {work}/constraints.txt && \\
    python -m pip install --no-cache-dir -r {work}/requirements.txt -c {work}/constraints.txt
"""
    return {
        "Dockerfile": dockerfile,
        "requirements.txt": requirements_text(project),
        "base_constraints.py": _constraints_script(project, base_image),
    }


def _constraints_script(project: Project, base_image: str) -> str:
    return f'''\
"""Run while Azure ML builds the environment (see Dockerfile): checks that the base image has
the Python {project.name} needs and the packages it must provide, and writes pip constraints
that pin those packages to the base image's own builds."""

import importlib.metadata
import sys

MINIMUM_PYTHON = {project.minimum_python!r}
FROM_BASE_IMAGE = {BASE_IMAGE_PACKAGES!r}
BASE_IMAGE = {base_image!r}

if MINIMUM_PYTHON and sys.version_info[:2] < MINIMUM_PYTHON:
    needed = ".".join(map(str, MINIMUM_PYTHON))
    sys.exit(
        f"{project.name} needs Python >={{needed}}, but {{BASE_IMAGE}} has "
        f"{{sys.version.split()[0]}}: set azureml.baseImage to an image with a newer Python"
    )
pins = []
for name in FROM_BASE_IMAGE:
    try:
        pins.append(f"{{name}}=={{importlib.metadata.version(name)}}\\n")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{{BASE_IMAGE}} has no {{name}}: set azureml.baseImage to a PyTorch image")
with open(sys.argv[1], "w", encoding="utf-8") as constraints:
    constraints.writelines(pins)
'''


def context_version(context: Mapping[str, str]) -> str:
    """The environment's version: a digest of its build context, so that a changed context is
    a new version (Azure ML refuses to change a registered version)."""
    digest = hashlib.sha256(json.dumps(sorted(context.items())).encode()).hexdigest()
    return digest[:12]


def environment_document(project: Project, base_image: str, version: str) -> dict[str, Any]:
    """environment.yaml: the same build, as a named environment to register (`az ml
    environment create -f environment.yaml`) and name in `azureml.environment`."""
    return {
        "$schema": ENVIRONMENT_SCHEMA,
        "name": project.name,
        "version": version,
        "description": f"{project.name}: {base_image} + the dependencies in pyproject.toml",
        "build": {"path": CONTEXT_DIR},
        "os_type": "linux",
        "tags": {"base_image": base_image, "project_version": str(project.version)},
    }


def input_path_for(store: str, spec: ClusterSpec) -> tuple[str, str | None]:
    """The store as an Azure ML `uri_folder` path, and a note when it needed explaining.

    azureml://, https://, wasbs:// and abfss://container@account... pass through; adlfs-style
    az://container/path (and abfs://container/path) need the account name, taken from
    data.accountName or from a mount of the same container; a local path is uploaded at submit.
    """
    passthrough = ("azureml://", "https://", "http://", "wasbs://", "wasb://")
    if store.startswith(passthrough):
        return store, None
    for scheme in ("az://", "abfs://", "abfss://"):
        if store.startswith(scheme):
            container, _, path = store[len(scheme) :].partition("/")
            if "@" in container:  # abfss://fs@account.dfs.core.windows.net/path
                return store, None
            account = spec.data.account_name or next(
                (m.account_name for m in spec.mounts if m.container_name == container), None
            )
            if account is None:
                raise ClusterError(
                    f"store {store}: Azure ML needs the storage account of container "
                    f'{container!r}; set "data": {{"accountName": "..."}} in cluster.json or give '
                    "the store as https://ACCOUNT.blob.core.windows.net/CONTAINER/PATH"
                )
            return f"https://{account}.blob.core.windows.net/{container}/{path}", None
    if not is_local(store):
        raise ClusterError(
            f"store {store}: Azure ML cannot read this URL; use azureml://, https:// or az://"
        )
    return str(Path(store).resolve()), f"store {store} is a local path: uploaded at submit"
