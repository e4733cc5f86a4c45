"""What the slurm engine submits: one sbatch script (`SlurmPlan`).

The script asks for `targetNodeCount` nodes with `processesPerNode` tasks each (and the CPUs,
GPUs, time, partition and account cluster.json gives), runs the `slurm.setup` lines, then
`srun` starts `python -m ENTRY_MODULE ARGV...` once per task: one process per rank, its rank,
local rank and node read from SLURM's own variables by the worker (no torchrun inside). The
master is the first node of the allocation at its NodeAddr (node names need not resolve), on a
port derived from the job id, so two jobs on one node do not collide.

Every rank's output goes to `LOG_DIR/job-<jobid>-rank-<r>.log` and the script's own (setup,
srun's messages) to `LOG_DIR/slurm-<jobid>.out`; LOG_DIR is `logs/` in the job's output dir,
which every node must see (a shared filesystem), or `slurm-logs/<name>` in the submission
directory when the output is a URL.

The job's secret environment (the storage options) is never written into the script: the
submitting process exports it and sbatch passes its environment on (`--export=ALL`); the
script only checks that it is there.

Quoting: every shell word is `shlex.quote`d; an `#SBATCH` value is double-quoted where it
needs it (sbatch reads double quotes and backslashes as a shell would, and an unquoted `#` as
a comment), and a path in a log file pattern has its `%` doubled (`%j`, `%t` are SLURM's). A
log directory with a line break or a backslash (which turns SLURM's patterns off) is refused.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.engine import Job, job_redactor, threads_per_worker
from cluster.errors import ClusterError
from cluster.failures import ERROR_DIR_ENV
from cluster.redact import REDACTED, Redactor
from cluster.slurm.section import SlurmSpec
from cluster.spec import ClusterSpec
from tiling.runtime.rankenv import GLOO_SOCKET_IFNAME_ENV, NCCL_SOCKET_IFNAME_ENV
from tiling.runtime.urls import is_local

SCRIPT_NAME = "slurm.sbatch"
# MASTER_PORT = MASTER_PORT_BASE + job id % MASTER_PORT_SPAN: above the well-known and
# registered ports most services use, below Linux's ephemeral range (32768-60999)
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 10000
# what a log directory cannot hold, and why: it is written into #SBATCH lines and srun patterns
_UNCARRIED = (
    ("\n", "a line break ends an #SBATCH line"),
    ("\r", "a line break ends an #SBATCH line"),
    ("\\", "a backslash turns SLURM's %j and %t patterns off"),
)


@dataclass(frozen=True, slots=True)
class SlurmPlan:
    """The sbatch script of a job, and where its logs go."""

    spec: ClusterSpec
    job: Job
    script: str
    log_dir: str
    threads_per_task: int | None
    notes: tuple[str, ...]
    redactor: Redactor = field(repr=False, compare=False)
    engine: str = "slurm"

    def batch_log(self, job_id: str) -> Path:
        """The script's own output (setup lines, srun's messages)."""
        return Path(self.log_dir) / f"slurm-{job_id}.out"

    def rank_log(self, job_id: str, rank: int | str) -> Path:
        return Path(self.log_dir) / f"job-{job_id}-rank-{rank}.log"

    def submit_command(self, script_path: str) -> list[str]:
        """The sbatch command line (`--parsable`: it prints only the job id)."""
        return ["sbatch", "--parsable", script_path]

    def describe(self) -> str:
        spec, slurm, r = self.spec, _slurm(self.spec), self.redactor
        per_task = f"{self.threads_per_task} CPU(s)" if self.threads_per_task else "SLURM's CPUs"
        gpus = f"{spec.gpus_per_node} GPU(s) per node" if spec.gpus_per_node else "no GPUs"
        asked = [
            f"partition {slurm.partition or '(default)'}",
            f"account {slurm.account or '(default)'}",
            f"time limit {slurm.time_limit or '(partition default)'}",
        ]
        lines = [
            "engine: slurm (sbatch; srun starts one process per task, ranks from SLURM)",
            f"job: {spec.name}: {spec.node_count} node(s) x {spec.processes_per_node} task(s) = "
            f"{spec.workers} worker(s); {per_task} per task; {gpus}",
            "; ".join(asked),
            "master: the first node's NodeAddr (scontrol show node), port "
            f"{MASTER_PORT_BASE} + job id % {MASTER_PORT_SPAN}",
            *(f"input {k}: {r.text(v)}" for k, v in self.job.inputs.items()),
            *(f"output {k}: {r.text(v)}" for k, v in self.job.outputs.items()),
            f"logs: {Path(self.log_dir) / 'job-<jobid>-rank-<r>.log'} (each rank), "
            f"{Path(self.log_dir) / 'slurm-<jobid>.out'} (the script)",
        ]
        if self.job.secret_env:
            lines.append(
                "environment: "
                + " ".join(f"{k}={REDACTED}" for k in self.job.secret_env)
                + " (exported where sbatch runs, passed on by --export=ALL; not in the script)"
            )
        lines.append(f"command: {r.text(_srun_line(self))}")
        lines.append(
            f"submit: mkdir -p {shlex.quote(self.log_dir)} && "
            + shlex.join(self.submit_command(SCRIPT_NAME))
        )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def files(self) -> dict[str, str]:
        return {SCRIPT_NAME: self.redactor.text(self.script)}


def _slurm(spec: ClusterSpec) -> SlurmSpec:
    return spec.section_of(SlurmSpec) or SlurmSpec()


def plan_slurm(spec: ClusterSpec, job: Job) -> SlurmPlan:
    """The sbatch script for `job` on `spec`, and the notes a user should read."""
    log_dir = _log_dir(job.output_dir, spec.name)
    for bad, why in _UNCARRIED:
        if bad in log_dir:
            raise ClusterError(
                f"log directory {log_dir!r} holds {bad!r}, which an sbatch script cannot carry "
                f"({why}): choose an output path without it"
            )
    threads = threads_per_worker(spec)
    plan = SlurmPlan(
        spec=spec,
        job=job,
        script="",
        log_dir=log_dir,
        threads_per_task=threads,
        notes=tuple(_notes(spec, job)),
        redactor=job_redactor(spec, job),
    )
    return replace(plan, script=_script(plan))


def _log_dir(out: str | None, name: str) -> str:
    if out is None or not is_local(out):  # the nodes cannot write logs to blob storage
        return str(Path("slurm-logs") / name)
    return str(Path(out) / "logs")


def _directives(plan: SlurmPlan) -> list[str]:
    spec, slurm = plan.spec, _slurm(plan.spec)
    log_dir = Path(plan.log_dir)
    options = [
        f"--job-name={spec.name}",
        f"--nodes={spec.node_count}",
        f"--ntasks-per-node={spec.processes_per_node}",
    ]
    if plan.threads_per_task:
        options.append(f"--cpus-per-task={plan.threads_per_task}")
    if spec.gpus_per_node:
        options.append(f"--gres=gpu:{spec.gpus_per_node}")
    if slurm.time_limit:
        options.append(f"--time={slurm.time_limit}")
    if slurm.partition:
        options.append(f"--partition={slurm.partition}")
    if slurm.account:
        options.append(f"--account={slurm.account}")
    batch_log = _log_pattern(log_dir, "slurm-%j.out")
    options += [
        _directive_value("--output", batch_log),
        _directive_value("--error", batch_log),
        # the secrets reach the job through the submitting environment
        "--export=ALL",
    ]
    options += [d.strip().removeprefix("#SBATCH").strip() for d in slurm.extra_directives]
    return [f"#SBATCH {option}" for option in options]


def _log_pattern(log_dir: Path, name: str) -> str:
    """`log_dir/name` as a SLURM file pattern: `name`'s %j, %t stay patterns, the directory's
    own % are doubled (SLURM's escape for a literal %)."""
    return f"{str(log_dir).replace('%', '%%')}/{name}"


def _directive_value(option: str, value: str) -> str:
    """`--option=value` as an #SBATCH line carries it: double-quoted when it holds a space, a
    quote, a backslash or a `#` (sbatch reads the line as a shell would, `#` as a comment)."""
    if not any(c.isspace() or c in "\"'\\#" for c in value):
        return f"{option}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{option}="{escaped}"'


def _srun_line(plan: SlurmPlan) -> str:
    rank_log = _log_pattern(Path(plan.log_dir), "job-%j-rank-%t.log")
    return shlex.join(
        [
            "srun",
            # one failed rank ends the step: the others would wait for it until the timeout
            "--kill-on-bad-exit=1",
            f"--output={rank_log}",
            "python",
            "-m",
            plan.job.entry_module,
            *plan.job.bound_argv(),
        ]
    )


def _script(plan: SlurmPlan) -> str:
    spec, slurm = plan.spec, _slurm(plan.spec)
    env = {"PYTHONUNBUFFERED": "1", ERROR_DIR_ENV: plan.log_dir}
    if plan.threads_per_task:
        env["OMP_NUM_THREADS"] = str(plan.threads_per_task)
    if slurm.socket_interface:  # gloo and NCCL otherwise pick the hostname's interface
        env[GLOO_SOCKET_IFNAME_ENV] = slurm.socket_interface
        env[NCCL_SOCKET_IFNAME_ENV] = slurm.socket_interface
    lines = [
        "#!/usr/bin/env bash",
        f"# landcover cluster plan: engine slurm, {spec.node_count} node(s) x "
        f"{spec.processes_per_node} task(s); submit with: mkdir -p {shlex.quote(plan.log_dir)}"
        f" && {shlex.join(plan.submit_command(SCRIPT_NAME))}",
        *_directives(plan),
        "set -eo pipefail",
        *slurm.setup,
        "set -u",  # after the setup: activate scripts may read unset variables
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        # secrets are not written here: sbatch passes the submitting environment on
        *(
            f': "${{{k}:?export {k} before sbatch (secret: kept out of this file)}}"'
            for k in plan.job.secret_env
        ),
        # node names need not resolve on the nodes: the master is the first node's NodeAddr
        'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'MASTER_ADDR=$(scontrol show node "$first_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        'export MASTER_ADDR="${MASTER_ADDR:-$first_node}"',
        f"export MASTER_PORT=$(( {MASTER_PORT_BASE} + SLURM_JOB_ID % {MASTER_PORT_SPAN} ))",
        'echo "landcover: nodes $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"',
        f"exec {_srun_line(plan)}",
    ]
    return "\n".join(lines) + "\n"


def _notes(spec: ClusterSpec, job: Job) -> list[str]:
    notes = list(spec.notes)
    out = job.output_dir
    if out is not None and is_local(out):
        notes.append(f"{out} must be on a filesystem every node shares (logs, checkpoints)")
    if spec.mounts:
        notes.append("mounts are not used on slurm: give the store as a shared path or a URL")
    if spec.setup_command:
        notes.append('setupCommand is not run on slurm: use "slurm": {"setup": [...]}')
    if spec.vm_size != "local" and spec.vcpus_per_node is None:
        notes.append(f"vmSize {spec.vm_size} is not in the VM size table: CPUs per task unknown")
    return notes
