"""The interface every engine implements, and what it is asked to run.

An engine turns (`ClusterSpec`, `Job`) into a `Plan` — everything it would do, shown redacted
and as files — and launches a plan. The engines (`cluster.engines` lists them: local, azureml,
kubernetes, slurm, dask, one sub-package of `cluster` each) are imported only when used, so
the Azure SDK is needed only for `azureml`, Dask only for `dask`.

A job is `python -m ENTRY_MODULE ARGV...` on every worker; the engines know nothing of what the
module does or what its arguments mean. What it reads and writes are named `inputs` and
`outputs` (name → path or URL), which an argument refers to as `${{inputs.NAME}}` or
`${{outputs.NAME}}` (`input_ref`, `output_ref`): Azure ML binds them itself (the store as a
mounted input, the run dir as an output it uploads); the other engines put the location in
place of the reference (`Job.bound_argv`). The first output is where the job's results go: the
local engine keeps its logs there and reports it as the run dir.

Secrets never go on a worker's command line (any user of the machine can read it in `ps`): a
job's `secret_env` (e.g. the storage options, account key included) reaches the workers through
their environment, and every plan redacts its values wherever they would be shown or written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

from cluster.engines import SharesCores, engine_info, load
from cluster.errors import ClusterError
from cluster.redact import Redactor, collect_secret_values
from cluster.spec import ClusterSpec
from tiling.runtime.atomic import text_writer, write_files_atomic
from tiling.runtime.machine import cores_per_rank

_REF = re.compile(r"\$\{\{(inputs|outputs)\.([A-Za-z_][A-Za-z0-9_]*)\}\}")


def input_ref(name: str) -> str:
    """How an argument names the job's input `name` (Azure ML's own syntax)."""
    return f"${{{{inputs.{name}}}}}"


def output_ref(name: str) -> str:
    """How an argument names the job's output `name`."""
    return f"${{{{outputs.{name}}}}}"


@dataclass(frozen=True, slots=True)
class Job:
    """What to run: `python -m ENTRY_MODULE ARGV...` on every worker, reading `inputs` and
    writing `outputs` (name → path or URL, referred to in ARGV by `input_ref`/`output_ref`),
    with `secret_env` added to the workers' environment (never shown: see `job_redactor`).

    `process_group=False` says the workers never form a torch process group: each needs only
    its place in the job (RANK, WORLD_SIZE, ...), as tile and predict ranks, which coordinate
    through their output. The local engine then starts them itself, without torchrun (whose
    start costs seconds, torch's import among them); the other engines start them as ever.
    """

    entry_module: str
    argv: tuple[str, ...] = ()
    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    process_group: bool = True

    def __post_init__(self) -> None:
        for arg in self.argv:
            for kind, name in _REF.findall(arg):
                if name not in (self.inputs if kind == "inputs" else self.outputs):
                    raise ClusterError(f"job argument {arg!r} names no {kind[:-1]} {name!r}")

    @property
    def output_dir(self) -> str | None:
        """Where the job's results go (its first output), if it has one."""
        return next(iter(self.outputs.values()), None)

    def bound_argv(self) -> list[str]:
        """ARGV with every input and output reference replaced by its location."""
        places = {"inputs": self.inputs, "outputs": self.outputs}
        return [_REF.sub(lambda m: places[m[1]][m[2]], arg) for arg in self.argv]


def job_redactor(spec: ClusterSpec, job: Job) -> Redactor:
    """Scrubs the spec's secrets and the job's secret environment values: each value whole,
    and, for a JSON object such as the storage options, each secret-named value inside it
    (an error message may quote the account key alone)."""
    values = set(spec.secret_values) | set(job.secret_env.values())
    for text in job.secret_env.values():
        with contextlib.suppress(ValueError):
            values |= collect_secret_values(json.loads(text))
    return Redactor(values)


def threads_per_worker(spec: ClusterSpec) -> int | None:
    """CPU threads for each worker: a fair share of the cores each worker really has. What
    the engine's section sets first (`slurm.cpusPerTask`, `dask.threadsPerWorker`, or the
    local share on the LocalCluster a dask launch starts); on an engine whose workers run on
    this machine (`EngineInfo.runs_here`) K = max(1, cores // workers), the cores being shared
    by every simulated node; elsewhere K = max(1, vCPUs per node // processes per node) when
    the VM size is known."""
    if isinstance(spec.section, SharesCores):
        threads = spec.section.worker_threads(spec.workers)
        if threads is not None:
            return threads
    if engine_info(spec.engine).runs_here:
        return cores_per_rank(spec.workers)
    if spec.vcpus_per_node:
        return max(1, spec.vcpus_per_node // spec.processes_per_node)
    return None


# ----------------------------------------------------------------------------- plans, launches


class Plan(Protocol):
    """What an engine would do. `describe()` and `files()` are redacted; launching uses the
    real values the plan holds privately."""

    @property
    def engine(self) -> str: ...

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def job(self) -> Job: ...

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
    # A job's temporary log folder (a job without a local output dir) is removed when it
    # succeeds. False: also when its workers refused their input (their one line says it all),
    # for a caller that streams the output (`--nproc`); a crash always keeps it.
    keep_logs: bool = True


@dataclass(frozen=True, slots=True)
class LaunchResult:
    engine: str
    job_id: str
    status: Literal["succeeded", "submitted"]
    run_dir: str | None  # the job's output dir, once it succeeded, if it is a local directory
    log_location: str | None
    wall_time_s: float
    url: str | None = None


class Engine(Protocol):
    def plan(self, spec: ClusterSpec, job: Job) -> Plan: ...

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult: ...


P = TypeVar("P", bound=Plan)


class PlanEngine(Generic[P]):
    """An `Engine` as its two steps: `make_plan(spec, job)` makes its kind of plan
    (`plan_type`), `run(plan, options)` launches one; `launch` refuses another engine's plan
    (a programming error: TypeError). An engine sets the three as class attributes (the two
    functions as staticmethods), or overrides `plan`."""

    plan_type: type[P]
    make_plan: Callable[[ClusterSpec, Job], P]
    run: Callable[[P, LaunchOptions], LaunchResult]

    def plan(self, spec: ClusterSpec, job: Job) -> P:
        return self.make_plan(spec, job)

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult:
        if not isinstance(plan, self.plan_type):
            raise TypeError(f"{type(self).__name__} cannot launch a {plan.engine} plan")
        return self.run(plan, options)


def get_engine(name: str) -> Engine:
    """The engine called `name` (imported on first use; `cluster.engines` lists them)."""
    engine: Engine = load(engine_info(name).target)()
    return engine


def plan_job(spec: ClusterSpec, job: Job) -> Plan:
    """Everything `launch_job` would do for this spec and job, without doing it."""
    return get_engine(spec.engine).plan(spec, job)


def launch_plan(plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
    return get_engine(plan.engine).launch(plan, options or LaunchOptions())


def launch_job(spec: ClusterSpec, job: Job, options: LaunchOptions | None = None) -> LaunchResult:
    return launch_plan(plan_job(spec, job), options)


PLAN_FILE = "plan.txt"
# plan.txt's last line lists the files the plan wrote, so that the next plan written into the
# directory with --overwrite removes those it does not write itself (a job.yaml left beside a
# new torchrun.sh would submit the stale plan) and nothing else.
_PLAN_FILES_PREFIX = "# files of this plan: "


def write_plan_files(plan: Plan, out_dir: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Write the plan's files (redacted) into out_dir, all or nothing, and return their paths.
    Refuses existing files (symlinks included) unless `overwrite`, and never replaces one that
    appeared meanwhile; with `overwrite`, afterwards removes the files that the previous plan
    written there listed in its plan.txt and this one does not write."""
    directory = Path(out_dir)
    names = [PLAN_FILE, *plan.files()]
    listing = f"{_PLAN_FILES_PREFIX}{json.dumps(names)}\n"
    files = {PLAN_FILE: plan.describe() + "\n" + listing, **plan.files()}
    targets = [directory / name for name in files]
    existing = [p for p in targets if os.path.lexists(p)]
    if existing and not overwrite:
        raise ClusterError(f"{existing[0]} exists; pass --overwrite to replace the plan files")
    stale = set(_previous_plan_files(directory / PLAN_FILE)) - set(names) if overwrite else set()
    modes: dict[Path, int | None] = {t: 0o755 for t in targets if t.suffix == ".sh"}
    writes = [(t, text_writer(text)) for t, text in zip(targets, files.values(), strict=True)]
    try:
        write_files_atomic(writes, overwrite=overwrite, modes=modes)
    except FileExistsError as exc:  # appeared since the check above: kept
        raise ClusterError(
            f"{exc.filename} exists; pass --overwrite to replace the plan files"
        ) from None
    for name in sorted(stale):
        _remove_plan_file(directory, name)
    return targets


def _remove_plan_file(directory: Path, name: str) -> None:
    """Remove `directory/name`, then its folders below `directory` that it leaves empty."""
    path = directory / name
    if path.is_dir() and not path.is_symlink():
        return  # a plan writes files: a directory there is the user's
    path.unlink(missing_ok=True)
    for folder in path.parents:
        if folder == directory:
            break
        try:
            folder.rmdir()
        except OSError:  # not empty (other files live there) or gone: kept
            break


def _previous_plan_files(plan_txt: Path) -> list[str]:
    """The file names (relative paths inside its directory, never above it) that the plan.txt
    of an earlier plan lists; none when there is no such plan.txt."""
    try:
        lines = plan_txt.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    if not lines or not lines[-1].startswith(_PLAN_FILES_PREFIX):
        return []
    try:
        names = json.loads(lines[-1].removeprefix(_PLAN_FILES_PREFIX))
    except json.JSONDecodeError:
        return []
    if not isinstance(names, list):
        return []
    return [
        n
        for n in names
        if isinstance(n, str)
        and n.strip("/")
        and not Path(n).is_absolute()
        and all(part not in ("", ".", "..") for part in n.split("/"))
    ]
