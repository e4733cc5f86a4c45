"""The Azure ML engine (SDK v2, `azure-ai-ml`, the optional extra `landcover[azureml]`).

A plan is YAML documents that `azure.ai.ml.load_compute` / `load_job` / `load_environment` (and
`az ml ... create -f`) accept:

- `compute.yaml`: an `AmlCompute` cluster of `vmSize`, `min_instances: 0` (scales to zero when
  idle, after `idleSecondsBeforeScaleDown`), `max_instances` >= targetNodeCount, tier from
  vmPriority;
- `job.yaml`: a command job on that compute, `instance_count = targetNodeCount`,
  `distribution: pytorch` with `process_count_per_instance = processesPerNode`, each of the
  job's inputs as a `uri_folder` input (mode `ro_mount` or `direct` from data.mode), each of its
  outputs as a `uri_folder` output, and the command `python -m ENTRY_MODULE ARGV...`, whose
  `${{inputs.NAME}}` and `${{outputs.NAME}}` Azure ML replaces by the mounted paths; its
  environment and code as `cluster.azureml.assets` plans them (by default an environment
  built from a PyTorch image plus the project's dependencies, the project directory uploaded
  and installed by the command first);
- `environment.yaml` and its build context `environment/` (the default environment only): the
  job's environment as a named one to register.

`launch` needs the SDK and credentials. Credentials are checked before anything else, and
fast: if no source that `DefaultAzureCredential` could use is present (service-principal or
workload-identity environment variables, a managed-identity endpoint, the az/azd/pwsh CLIs,
or the Azure instance metadata service, probed with a 1 s timeout), it fails at once; else one
token is requested with a time limit. Either way the user gets one line saying what to do.
The SDK is imported only inside `launch`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from cluster.azureml.assets import CONTEXT_DIR, JobEnvironment, input_path_for, plan_environment
from cluster.azureml.section import AzureMLSpec
from cluster.engine import (
    Job,
    LaunchOptions,
    LaunchResult,
    PlanEngine,
    input_ref,
    job_redactor,
    output_ref,
    threads_per_worker,
)
from cluster.errors import ClusterError, EngineUnavailableError, LaunchError
from cluster.redact import Redactor
from cluster.spec import ClusterSpec
from tiling.runtime.urls import is_local

logger = logging.getLogger(__name__)

JOB_SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
COMPUTE_SCHEMA = "https://azuremlschemas.azureedge.net/latest/amlCompute.schema.json"
MANAGEMENT_SCOPE = "https://management.azure.com/.default"
IMDS_URL = "http://169.254.169.254/metadata/instance/compute?api-version=2021-02-01"
IMDS_TIMEOUT_S = 1.0
TOKEN_TIMEOUT_S = 30.0
INSTALL_HINT = "pip install 'landcover[azureml]'"
LOGIN_HINT = (
    "run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET "
    "for a service principal"
)


@dataclass(frozen=True, slots=True)
class AzureMLPlan:
    spec: ClusterSpec
    job: Job
    job_document: Mapping[str, Any]  # real values: what is submitted
    compute_document: Mapping[str, Any]
    environment: JobEnvironment
    notes: tuple[str, ...]
    redactor: Redactor = field(repr=False, compare=False)
    engine: str = "azureml"

    @property
    def azureml(self) -> AzureMLSpec:
        return self.spec.required_section(AzureMLSpec)

    def describe(self) -> str:
        spec, aml, doc = self.spec, self.azureml, self.job_document
        lines = [
            "engine: azureml (Azure ML SDK v2: AmlCompute cluster + PyTorch command job)",
            f"workspace: {aml.workspace} (resource group {aml.resource_group}, "
            f"subscription {aml.subscription_id})",
            f"compute: {aml.compute_name}: {spec.vm_size} x 0..{spec.max_nodes} "
            f"({spec.vm_priority}), scales to zero after "
            f"{aml.idle_seconds_before_scale_down} s idle",
            f"job: {spec.node_count} node(s) x {spec.processes_per_node} process(es) = "
            f"{spec.workers} worker(s)",
            f"environment: {self.environment.description}",
            *(
                [f"code: {doc['code']} (uploaded; .amlignore, else .gitignore, leaves files out)"]
                if "code" in doc
                else []
            ),
            *(f"input {k}: {v['path']} ({v['mode']})" for k, v in doc["inputs"].items()),
            *(
                f"output {k}: {v.get('path', 'workspace default')}"
                for k, v in doc["outputs"].items()
            ),
            f"command: {doc['command']}",
        ]
        lines += [f"note: {n}" for n in self.notes]
        return self.redactor.text("\n".join(lines))

    def files(self) -> dict[str, str]:
        return self._render(self.redactor.data)

    def documents(self) -> dict[str, str]:
        """The plan's files with their real values: what `launch` submits (`files()` is what
        may be shown or written)."""
        return self._render(lambda document: document)

    def _render(self, transform: Callable[[Any], Any]) -> dict[str, str]:
        files = {
            "job.yaml": _yaml(transform(self.job_document)),
            "compute.yaml": _yaml(transform(self.compute_document)),
        }
        environment = self.environment
        if environment.document is not None:
            files["environment.yaml"] = _yaml(transform(environment.document))
            for name, text in environment.context.items():
                files[f"{CONTEXT_DIR}/{name}"] = transform(text)
        return files


def _yaml(document: Any) -> str:
    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1000))


_BINDING = re.compile(r"(\$\{\{.*?\}\})")


def _command_word(arg: str, job: Job) -> str:
    """One word of the job's command for the shell Azure ML runs it in: shell-quoted, but for
    its `${{inputs.NAME}}` / `${{outputs.NAME}}` references, which Azure ML replaces by the
    mounted paths before the shell reads the command. Any other `${{` is refused: Azure ML
    would read it as a binding and fail the job."""
    bindings = {input_ref(n) for n in job.inputs} | {output_ref(n) for n in job.outputs}
    words = []
    for part in _BINDING.split(arg):
        if part in bindings:
            words.append(part)
        elif "${{" in part:
            raise ClusterError(
                f"job argument {arg!r} holds '${{{{', which Azure ML reads as an input or output "
                "binding: remove it from the argument"
            )
        elif part:
            words.append(shlex.quote(part))
    return "".join(words) or "''"


class AzureMLEngine(PlanEngine[AzureMLPlan]):
    """An Azure ML command job on a compute cluster, submitted through the SDK."""

    plan_type = AzureMLPlan

    def plan(self, spec: ClusterSpec, job: Job) -> AzureMLPlan:
        aml = spec.required_section(AzureMLSpec)
        notes = list(spec.notes)
        inputs: dict[str, Any] = {}
        for name, location in job.inputs.items():
            input_path, note = input_path_for(location, spec)
            if note:
                notes.append(note)
            mode = "ro_mount" if spec.data.mode == "mount" else "direct"
            inputs[name] = {"type": "uri_folder", "path": input_path, "mode": mode}
        outputs: dict[str, Any] = {}
        for name, location in job.outputs.items():
            outputs[name] = {"type": "uri_folder", "mode": "rw_mount"}
            if location.startswith("azureml://"):
                outputs[name]["path"] = location
            else:
                notes.append(
                    f"output {name} {location} is not reachable from Azure ML: the job writes "
                    f"its output {name!r}; `launch --wait` downloads it there"
                )
        environment = plan_environment(aml, job.entry_module)
        command = " ".join(
            _command_word(a, job) for a in ["python", "-m", job.entry_module, *job.argv]
        )
        if environment.install_command is not None:
            command = f"{environment.install_command} && {command}"
        document: dict[str, Any] = {
            "$schema": JOB_SCHEMA,
            "type": "command",
            "display_name": spec.name,
            "experiment_name": aml.experiment_name,
            "description": f"{job.entry_module}: {spec.workers} worker(s)",
            "command": command,
            "environment": environment.job_value,
            "compute": f"azureml:{aml.compute_name}",
            "resources": {"instance_count": spec.node_count},
            "distribution": {
                "type": "pytorch",
                "process_count_per_instance": spec.processes_per_node,
            },
            "inputs": inputs,
            "outputs": outputs,
            "tags": {"landcover_workers": str(spec.workers)},
        }
        threads = threads_per_worker(spec)
        variables = {"OMP_NUM_THREADS": str(threads)} if threads is not None else {}
        # secrets (the storage options) as job environment, never on the command line
        variables.update(job.secret_env)
        if variables:
            document["environment_variables"] = variables
        if environment.code is not None:
            # the uploaded snapshot is the working directory: `-m ENTRY_MODULE` finds it
            document["code"] = environment.code
        compute = {
            "$schema": COMPUTE_SCHEMA,
            "name": aml.compute_name,
            "type": "amlcompute",
            "size": spec.vm_size,
            "min_instances": 0,
            "max_instances": spec.max_nodes,
            "idle_time_before_scale_down": aml.idle_seconds_before_scale_down,
            "tier": "low_priority" if spec.vm_priority == "lowpriority" else "dedicated",
        }
        if spec.elastic is not None:
            notes.append(
                "elastic: Azure ML command jobs run on exactly instance_count nodes and do not "
                "restart workers; elastic applies to the local and kubernetes engines"
            )
        if spec.gpus_per_node is None:
            notes.append(f"vmSize {spec.vm_size} is not in cluster/vmsizes.py: not checked")
        if spec.setup_command:
            notes.append(
                "setupCommand is not run by Azure ML: put what it installs in the environment "
                "(azureml.image, or a registered azureml.environment)"
            )
        if spec.mounts:
            notes.append(
                "mounts: Azure ML mounts the store input itself (data.mode); account keys in "
                "cluster.json are not used (the workspace identity reaches the storage)"
            )
        return AzureMLPlan(
            spec=spec,
            job=job,
            job_document=document,
            compute_document=compute,
            environment=environment,
            notes=tuple(notes),
            redactor=job_redactor(spec, job),
        )

    def run(self, plan: AzureMLPlan, options: LaunchOptions) -> LaunchResult:
        return _submit(plan, options)


# ----------------------------------------------------------------------------- credentials


def credential_sources(env: Mapping[str, str] | None = None) -> list[str]:
    """The credential sources DefaultAzureCredential could use here (fast, no token)."""
    env = os.environ if env is None else env
    sources = []
    if env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"):
        if env.get("AZURE_CLIENT_SECRET") or env.get("AZURE_CLIENT_CERTIFICATE_PATH"):
            sources.append("service principal (environment)")
        if env.get("AZURE_FEDERATED_TOKEN_FILE"):
            sources.append("workload identity")
    if env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT"):
        sources.append("managed identity (endpoint)")
    path = env.get("PATH")
    for tool, label in (("az", "Azure CLI"), ("azd", "Azure Developer CLI"), ("pwsh", "pwsh")):
        if shutil.which(tool, path=path):
            sources.append(label)
    if not sources and _imds_answers():
        sources.append("managed identity (instance metadata)")
    return sources


def _imds_answers() -> bool:
    """Whether the Azure instance metadata service answers (only on Azure VMs); 1 s at most."""
    request = urllib.request.Request(IMDS_URL, headers={"Metadata": "true"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=IMDS_TIMEOUT_S) as response:
            body = json.loads(response.read(65536) or b"{}")
    except (OSError, ValueError):  # URLError, timeouts and refusals are OSErrors
        return False
    return isinstance(body, dict) and "vmId" in body


def check_credentials(timeout_s: float = TOKEN_TIMEOUT_S) -> Any:
    """A DefaultAzureCredential that has just produced a token; one-line error otherwise."""
    sources = credential_sources()
    if not sources:
        raise EngineUnavailableError(f"no Azure credentials found: {LOGIN_HINT}")
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise EngineUnavailableError(
            f"the azureml engine needs azure-identity: {INSTALL_HINT}"
        ) from None
    credential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
    outcome: dict[str, BaseException | None] = {}

    def request_token() -> None:
        try:
            credential.get_token(MANAGEMENT_SCOPE)
            outcome["error"] = None
        except BaseException as exc:  # reported to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=request_token, daemon=True, name="azure-token")
    thread.start()
    thread.join(timeout_s)
    if "error" not in outcome:
        raise EngineUnavailableError(
            f"Azure credentials ({', '.join(sources)}) gave no token within {timeout_s:g} s: "
            f"check the network, then {LOGIN_HINT}"
        )
    error = outcome["error"]
    if error is not None:
        raise EngineUnavailableError(
            f"Azure credentials failed ({_first_line(error)}): {LOGIN_HINT}"
        )
    return credential


# ----------------------------------------------------------------------------- submission


def _submit(plan: AzureMLPlan, options: LaunchOptions) -> LaunchResult:
    # is the SDK there (without paying seconds to import it before the credential check)?
    if importlib.util.find_spec("azure.ai.ml") is None:
        raise EngineUnavailableError(f"the azureml engine needs the Azure ML SDK: {INSTALL_HINT}")
    credential = check_credentials()
    from azure.ai.ml import MLClient, load_compute, load_job
    from azure.core.exceptions import AzureError

    aml = plan.azureml
    started = time.monotonic()
    redact = plan.redactor.text
    try:
        client = MLClient(credential, aml.subscription_id, aml.resource_group, aml.workspace)
        with tempfile.TemporaryDirectory(prefix="landcover-aml-") as tmp:
            # the real (unredacted) documents go only to this private temporary directory
            for name, text in plan.documents().items():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / name).write_text(text)
            logger.info("creating or updating compute %s", aml.compute_name)
            client.compute.begin_create_or_update(load_compute(Path(tmp) / "compute.yaml")).result()
            submitted = client.jobs.create_or_update(load_job(Path(tmp) / "job.yaml"))
        name = str(submitted.name)
        url = getattr(submitted, "studio_url", None)
        logger.info("submitted Azure ML job %s: %s", name, url)
        run_dir = _await_job(client, plan, name, url) if options.wait else None
    except AzureError as exc:
        raise LaunchError(redact(f"Azure ML refused the request: {_first_line(exc)}")) from None
    return LaunchResult(
        engine="azureml",
        job_id=name,
        status="succeeded" if options.wait else "submitted",
        run_dir=run_dir,
        log_location=url,
        wall_time_s=time.monotonic() - started,
        url=url,
    )


def _await_job(client: Any, plan: AzureMLPlan, name: str, url: str | None) -> str | None:
    """Stream job `name`'s logs until it ends; LaunchError unless it completed. Its output,
    when that is a local path, is downloaded there (the run directory returned)."""
    client.jobs.stream(name)
    status = str(client.jobs.get(name).status)
    if status != "Completed":
        raise LaunchError(f"Azure ML job {name} ended {status}; logs: {url}")
    output = next(iter(plan.job.outputs.items()), None)
    if output is None or not is_local(output[1]):
        return None
    return _download_output(client, name, output[0], Path(output[1]))


def _download_output(client: Any, name: str, output: str, out: Path) -> str:
    """Fetch the job's output `output` into `out` (through a temporary sibling, then renamed).
    The SDK puts it in DOWNLOAD_PATH/named-outputs/OUTPUT."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-download-", dir=out.parent) as tmp:
        client.jobs.download(name, download_path=tmp, output_name=output)
        named = Path(tmp) / "named-outputs" / output
        source = named if named.is_dir() else Path(tmp)
        if out.exists():
            raise LaunchError(f"{out} exists; the run of job {name} stays in Azure ML")
        shutil.move(str(source), str(out))
    return str(out)


def _first_line(exc: BaseException) -> str:
    """An error's first line, else its type's name: Azure SDK messages run to pages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
