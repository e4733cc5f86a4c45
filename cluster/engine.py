"""The interface every engine implements, and what it is asked to run.

An engine turns (`ClusterSpec`, `TrainJob`) into a `Plan` — everything it would do, shown
redacted and as files — and launches a plan. The three engines (`cluster.local`,
`cluster.azureml`, `cluster.kubernetes`) are imported only when used, so the Azure SDK is
needed only for `azureml`.

The training arguments each worker gets are decided here, the same way for every engine:
`STORE --out RUN_DIR [user options] [--resume] [--threads K]`. `--resume` is added when the spec
allows restarts (the trainer's `--resume` starts fresh when there is no checkpoint, so a
restarted worker group continues from the last checkpoint); the user's `--overwrite` is then
done once by the local engine before launching and dropped from the worker arguments (a
restarted group must resume, not wipe), and a local run dir that already holds a run is refused
unless `--resume` or `--overwrite` says what to do with it. `--threads K` is added unless the
user gave it: on the local engine K = max(1, cores // (nodes × processes per node)), the cores
being shared by every simulated node; elsewhere K = max(1, vCPUs per node // processes per node)
when the VM size is known.

Secrets never go on a worker's command line (any user of the machine can read it in `ps`): a
job's `secret_env` (e.g. the storage options, account key included) reaches the workers through
their environment, and every plan redacts its values wherever they would be shown or written.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from cluster.errors import ClusterError
from cluster.redact import Redactor, collect_secret_values
from cluster.spec import ClusterSpec, local_cpu_count

DEFAULT_ENTRY_MODULE = "landcover.training"


@dataclass(frozen=True, slots=True)
class TrainJob:
    """What to run: `python -m ENTRY_MODULE STORE --out OUT ARGS...` on every worker, with
    `secret_env` added to the workers' environment (never shown: see `job_redactor`)."""

    store: str
    out: str
    args: tuple[str, ...] = ()
    entry_module: str = DEFAULT_ENTRY_MODULE
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def has_option(self, name: str) -> bool:
        return any(a == name or a.startswith(name + "=") for a in self.args)


def job_redactor(spec: ClusterSpec, job: TrainJob) -> Redactor:
    """Scrubs the spec's secrets and the job's secret environment values: each value whole,
    and, for a JSON object such as the storage options, each secret-named value inside it
    (an error message may quote the account key alone)."""
    values = set(spec.secret_values) | set(job.secret_env.values())
    for text in job.secret_env.values():
        with contextlib.suppress(ValueError):
            values |= collect_secret_values(json.loads(text))
    return Redactor(values)


def parse_train_args(
    args: Sequence[str],
    *,
    default_store: str | None = None,
    entry_module: str = DEFAULT_ENTRY_MODULE,
) -> TrainJob:
    """`train STORE --out RUN_DIR [options]` (what follows `--` on the command line) as a job.

    The leading word `train` is optional; STORE may be left out when cluster.json gives
    `data.url`. `--nproc` is refused: on a cluster the spec decides the processes.
    """
    tokens = list(args)
    if tokens and tokens[0] == "train":
        tokens.pop(0)
    if tokens and not tokens[0].startswith("-"):
        store: str | None = tokens.pop(0)
    else:
        store = default_store
    if not store:
        raise ClusterError(
            "no chip store: give it after `train` (`-- train STORE --out RUN_DIR ...`) "
            'or set "data": {"url": ...} in cluster.json'
        )
    out: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--out" or token.startswith("--out="):
            if out is not None:
                raise ClusterError("--out is given twice in the training arguments; keep one")
            if token == "--out":
                if i + 1 >= len(tokens):
                    raise ClusterError("--out needs a value: `--out RUN_DIR`")
                out = tokens[i + 1]
                i += 2
                continue
            out = token.split("=", 1)[1]
        elif token == "--nproc" or token.startswith("--nproc="):
            raise ClusterError(
                "--nproc is for `landcover train` on one machine; on a cluster set "
                "processesPerNode (and targetNodeCount) in cluster.json instead"
            )
        else:
            rest.append(token)
        i += 1
    if not out:
        raise ClusterError(
            "the training arguments need --out RUN_DIR (where the run directory goes)"
        )
    return TrainJob(store=store, out=out, args=tuple(rest), entry_module=entry_module)


def threads_per_worker(spec: ClusterSpec) -> int | None:
    """Torch threads for each worker: a fair share of the cores each worker really has."""
    if spec.engine == "local":
        return max(1, local_cpu_count() // spec.workers)
    if spec.vcpus_per_node:
        return max(1, spec.vcpus_per_node // spec.processes_per_node)
    return None


def worker_args(spec: ClusterSpec, job: TrainJob, *, store: str, out: str) -> list[str]:
    """The arguments after `-m ENTRY_MODULE` on every worker (store and out as the engine
    names them: a path, or `${{inputs.store}}` on Azure ML)."""
    args = [store, "--out", out, *job.args]
    if spec.max_restarts > 0:
        # every (re)start must resume; a requested --overwrite is done once, before launch,
        # by the engine (`clear_run_results`), not by each restarted worker group
        args = [a for a in args if a != "--overwrite"]
        if not job.has_option("--resume"):
            args.append("--resume")
    threads = threads_per_worker(spec)
    if threads is not None and not job.has_option("--threads"):
        args += ["--threads", str(threads)]
    return args


# What a training run leaves in its run dir (docs/CONTRACTS.md, "Run directory").
RUN_RESULTS = ("run.json", "metrics.jsonl", "model.pt", "checkpoints")


def check_run_dir(spec: ClusterSpec, job: TrainJob) -> list[str]:
    """Results already in a local run dir that launching would touch, and what to do.

    With restarts every worker gets --resume, so an old run would be continued silently:
    refuse unless the user said --resume or --overwrite. Returns the result names found."""
    if is_url(job.out):
        return []
    out = Path(job.out)
    found = [name for name in RUN_RESULTS if (out / name).exists()]
    if (
        found
        and spec.max_restarts > 0
        and not (job.has_option("--resume") or job.has_option("--overwrite"))
    ):
        raise ClusterError(
            f"{out}: already holds a training run ({', '.join(found)}); pass --resume to "
            "continue it or --overwrite to replace it"
        )
    return found


def clear_run_results(out: str, found: Sequence[str]) -> None:
    """--overwrite with restarts: remove the old run's results once, before launching."""
    for name in found:
        path = Path(out) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def is_url(path: str) -> bool:
    return "://" in path or path.startswith("azureml:")


# ----------------------------------------------------------------------------- plans, launches


class Plan(Protocol):
    """What an engine would do. `describe()` and `files()` are redacted; launching uses the
    real values the plan holds privately."""

    @property
    def engine(self) -> str: ...

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def job(self) -> TrainJob: ...

    def describe(self) -> str: ...

    def files(self) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class LaunchOptions:
    """How to launch. `on_output` receives every line of worker output (redacted, prefixed
    with the node); `wait` makes remote engines wait for the job and fetch its run dir."""

    on_output: Callable[[str], None] | None = None
    wait: bool = False
    timeout_s: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class LaunchResult:
    engine: str
    job_id: str
    status: Literal["succeeded", "submitted"]
    run_dir: str | None  # a local directory holding the run once it succeeded, if any
    log_location: str | None
    wall_time_s: float
    url: str | None = None


class Engine(Protocol):
    def plan(self, spec: ClusterSpec, job: TrainJob) -> Plan: ...

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult: ...


_ENGINE_CLASSES: dict[str, str] = {
    "local": "cluster.local:LocalEngine",
    "azureml": "cluster.azureml:AzureMLEngine",
    "kubernetes": "cluster.kubernetes:KubernetesEngine",
}


def get_engine(name: str) -> Engine:
    """The engine called `name` (imported on first use)."""
    target = _ENGINE_CLASSES.get(name)
    if target is None:
        raise ClusterError(f"unknown engine {name!r}; use one of {', '.join(_ENGINE_CLASSES)}")
    module_name, attr = target.split(":")
    engine: Engine = getattr(importlib.import_module(module_name), attr)()
    return engine


def plan_job(spec: ClusterSpec, job: TrainJob) -> Plan:
    """Everything `launch_job` would do for this spec and job, without doing it."""
    return get_engine(spec.engine).plan(spec, job)


def launch_plan(plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
    return get_engine(plan.engine).launch(plan, options or LaunchOptions())


def launch_job(
    spec: ClusterSpec, job: TrainJob, options: LaunchOptions | None = None
) -> LaunchResult:
    return launch_plan(plan_job(spec, job), options)


def write_plan_files(plan: Plan, out_dir: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Write the plan's files (redacted) into out_dir, each atomically; refuses to replace
    existing files unless overwrite."""
    directory = Path(out_dir)
    files = {"plan.txt": plan.describe() + "\n", **plan.files()}
    targets = [directory / name for name in files]
    existing = [p for p in targets if p.exists()]
    if existing and not overwrite:
        raise ClusterError(f"{existing[0]} exists; pass --overwrite to replace the plan files")
    directory.mkdir(parents=True, exist_ok=True)
    for target, text in zip(targets, files.values(), strict=True):
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        if target.suffix == ".sh":
            tmp.chmod(0o755)
        os.replace(tmp, target)
    return targets
