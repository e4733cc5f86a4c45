"""The local engine: torchrun on this machine, each simulated node one torchrun agent.

`targetNodeCount` nodes are `targetNodeCount` torchrun agents that meet through a c10d
rendezvous on 127.0.0.1 (a free port), each starting `processesPerNode` workers — the same
elastic agent code path a real multi-node job takes, so restarts and rejoining are exercised
for real. With `elastic.maxRestarts` > 0 a failed worker group is restarted (every agent
re-rendezvouses); continuing where it stopped is the job's business.

Agent output (which includes the workers') goes line by line, redacted, to
`LOG_DIR/node-<i>.log`, and all but the failure noise (`cluster.output`) to
`LaunchOptions.on_output`; LOG_DIR is `logs/` in the job's output dir (or a temporary directory
when that is a URL or there is none). Workers that fail leave their one-line error in LOG_DIR
(`cluster.failures`). If any agent fails, the others are stopped and `LaunchError` gives the
first failing rank's own error line and LOG_DIR, or, when no worker left one (a killed worker),
the failing node's log.

The job's secret environment (the storage options) reaches the agents, and through them the
workers, only in their process environment: never in an argument, a log line or a file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]

from cluster.engine import (
    Job,
    LaunchOptions,
    LaunchResult,
    Plan,
    is_url,
    job_redactor,
    threads_per_worker,
)
from cluster.errors import LaunchError
from cluster.failures import ERROR_DIR_ENV, clear_worker_errors, first_worker_error
from cluster.output import OutputPump, TerminalFilter
from cluster.redact import REDACTED, Redactor
from cluster.spec import ClusterSpec, local_cpu_count, local_gpu_count

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Seconds an agent waits after SIGTERM (it forwards it to its workers) before SIGKILL.
STOP_GRACE_S = 10.0
_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class LocalPlan:
    """Everything a local launch does: one command line per simulated node."""

    spec: ClusterSpec
    job: Job
    agent_commands: tuple[tuple[str, ...], ...]
    agent_env: tuple[Mapping[str, str], ...]  # per agent, on top of `env`
    env: Mapping[str, str]
    rdzv_endpoint: str
    rdzv_id: str
    threads_per_worker: int
    cores: int
    log_dir: str
    redactor: Redactor = field(repr=False, compare=False)
    gpu_note: str | None = None
    engine: str = "local"

    @property
    def oversubscribed(self) -> bool:
        """More workers than cores: the measurement says little about real scaling."""
        return self.spec.workers > self.cores

    def log_path(self, node: int) -> str:
        return str(Path(self.log_dir) / f"node-{node}.log")

    def describe(self) -> str:
        spec = self.spec
        r = self.redactor
        lines = [
            "engine: local (torchrun agents on this machine, c10d rendezvous)",
            f"cluster: {spec.name}: {spec.node_count} simulated node(s) x "
            f"{spec.processes_per_node} process(es) = {spec.workers} worker(s)",
            f"cores: {self.cores}; {self.threads_per_worker} thread(s) per worker"
            + (
                f" (OVERSUBSCRIBED: {spec.workers} workers on {self.cores} cores)"
                if self.oversubscribed
                else ""
            ),
            f"rendezvous: c10d at {self.rdzv_endpoint}, id {self.rdzv_id}",
            _restarts_line(spec),
            *(f"input {k}: {r.text(v)}" for k, v in self.job.inputs.items()),
            *(f"output {k}: {r.text(v)}" for k, v in self.job.outputs.items()),
            f"logs: {Path(self.log_dir) / 'node-<i>.log'}",
            "environment: "
            + " ".join(
                [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
                + [f"{k}={REDACTED}" for k in self.job.secret_env]
            ),
        ]
        for i, command in enumerate(self.agent_commands):
            extra = " ".join(f"{k}={v}" for k, v in self.agent_env[i].items())
            lines.append(f"node {i}: {extra + ' ' if extra else ''}{_shell(r.args(command))}")
        notes = _notes(spec) + ([self.gpu_note] if self.gpu_note else [])
        lines += [f"note: {n}" for n in notes]
        return "\n".join(lines)

    def files(self) -> dict[str, str]:
        """`torchrun.sh`: the same launch as a shell script (redacted)."""
        r = self.redactor
        out = [
            "#!/usr/bin/env bash",
            f"# landcover cluster plan: engine local, {self.spec.node_count} simulated node(s) x "
            f"{self.spec.processes_per_node} process(es)",
            "set -u",
            *(f"export {k}={shlex.quote(v)}" for k, v in self.env.items()),
            # secrets are not written here: the workers read them from the environment
            *(
                f': "${{{k}:?export {k} first (secret: kept out of this file)}}"'
                for k in self.job.secret_env
            ),
            f"mkdir -p {shlex.quote(self.log_dir)}",
            "pids=()",
        ]
        for i, command in enumerate(self.agent_commands):
            extra = "".join(f"{k}={shlex.quote(v)} " for k, v in self.agent_env[i].items())
            out.append(f"{extra}{_shell(r.args(command))} > {shlex.quote(self.log_path(i))} 2>&1 &")
            out.append("pids+=($!)")
        out += [
            "status=0",
            'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
            'exit "$status"',
        ]
        return {"torchrun.sh": "\n".join(out) + "\n"}


def _restarts_line(spec: ClusterSpec) -> str:
    if spec.elastic is None:
        return "restarts: none (a failed worker fails the job)"
    e = spec.elastic
    return (
        f"restarts: up to {e.max_restarts}, nodes {e.min_nodes}..{e.max_nodes}; a restarted "
        "worker group starts again with the same arguments"
    )


def _notes(spec: ClusterSpec) -> list[str]:
    notes = list(spec.notes)
    if spec.mounts:
        notes.append("mounts are not used locally: give the store as a path or URL")
    if spec.setup_command:
        notes.append("setupCommand is not run locally")
    if spec.vm_size != "local":
        notes.append(f"vmSize {spec.vm_size} is only a label here: this machine runs the job")
    return notes


def _shell(argv: list[str]) -> str:
    return shlex.join(argv)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


class LocalEngine:
    """torchrun on this machine; `targetNodeCount` agents simulate the nodes."""

    def plan(self, spec: ClusterSpec, job: Job) -> LocalPlan:
        cores = local_cpu_count()
        threads = threads_per_worker(spec) or 1
        endpoint = f"{LOOPBACK}:{free_port()}"
        rdzv_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        if spec.elastic is not None and spec.elastic.min_nodes != spec.elastic.max_nodes:
            nnodes = f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}"
        else:
            nnodes = str(spec.node_count)
        args = job.bound_argv()
        log_dir = _log_dir(job.output_dir, rdzv_id)
        commands = []
        for node in range(spec.node_count):
            # is_host pins the rendezvous store on agent 0 instead of a race to bind the port;
            # a short last call: every agent starts at once, none is worth waiting 30 s for
            conf = f"is_host={1 if node == 0 else 0},last_call_timeout=1"
            commands.append(
                (
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    nnodes,
                    "--nproc-per-node",
                    str(spec.processes_per_node),
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    endpoint,
                    "--rdzv-id",
                    rdzv_id,
                    "--rdzv-conf",
                    conf,
                    "--local-addr",
                    LOOPBACK,
                    "--max-restarts",
                    str(spec.max_restarts),
                    "-m",
                    job.entry_module,
                    *args,
                )
            )
        agent_env, gpu_note = _gpu_partition(spec)
        env = {
            "OMP_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1",
            # torch shares the rendezvous TCPStore with the workers by default and keeps it
            # across restarts, so restarted workers read the dead group's addresses and
            # hang; a fresh store per round makes elastic restarts work (torch 2.15)
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            # a failing worker leaves its one-line error there (cluster.failures)
            ERROR_DIR_ENV: log_dir,
        }
        return LocalPlan(
            spec=spec,
            job=job,
            agent_commands=tuple(commands),
            agent_env=agent_env,
            gpu_note=gpu_note,
            env=env,
            rdzv_endpoint=endpoint,
            rdzv_id=rdzv_id,
            threads_per_worker=threads,
            cores=cores,
            log_dir=log_dir,
            redactor=job_redactor(spec, job),
        )

    def launch(self, plan: Plan, options: LaunchOptions) -> LaunchResult:
        if not isinstance(plan, LocalPlan):
            raise TypeError(f"the local engine cannot launch a {plan.engine} plan")
        return _run_agents(plan, options)


def _log_dir(out: str | None, rdzv_id: str) -> str:
    if out is None or is_url(out):  # output on blob storage: the logs stay on this machine
        return str(Path(tempfile.gettempdir()) / f"landcover-launch-{rdzv_id}")
    return str(Path(out) / "logs")


def _gpu_partition(spec: ClusterSpec) -> tuple[tuple[Mapping[str, str], ...], str | None]:
    """Per-agent CUDA_VISIBLE_DEVICES, and a note when the GPUs cannot go round.

    NCCL wants one GPU per worker: each simulated node gets its own slice when there are
    enough; otherwise the GPUs are hidden and every worker trains on CPU (gloo), rather than
    two ranks colliding on one device."""
    gpus = local_gpu_count()
    nodes, per_node = spec.node_count, spec.processes_per_node
    if gpus == 0 or (nodes == 1 and gpus >= per_node):
        return tuple({} for _ in range(nodes)), None
    if gpus < nodes * per_node:
        note = (
            f"{nodes * per_node} workers but {gpus} GPU(s) here: GPUs hidden, workers train on "
            "CPU (NCCL needs one GPU per worker)"
        )
        return tuple({"CUDA_VISIBLE_DEVICES": ""} for _ in range(nodes)), note
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(gpus)]
    return tuple(
        {"CUDA_VISIBLE_DEVICES": ",".join(ids[n * per_node : (n + 1) * per_node])}
        for n in range(nodes)
    ), None


# ----------------------------------------------------------------------------- running


def _run_agents(plan: LocalPlan, options: LaunchOptions) -> LaunchResult:
    log_dir = Path(plan.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for i in range(len(plan.agent_commands)):  # one launch, one set of logs
        Path(plan.log_path(i)).unlink(missing_ok=True)
    clear_worker_errors(log_dir)
    if plan.gpu_note:  # `train --nproc` prints no plan: say why the GPUs go unused
        logger.warning("%s", plan.gpu_note)
    logger.info(
        "launching %d simulated node(s) x %d process(es); logs in %s",
        plan.spec.node_count,
        plan.spec.processes_per_node,
        log_dir,
    )
    started = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    pumps: list[OutputPump] = []
    job_failed = threading.Event()
    several = len(plan.agent_commands) > 1
    try:
        for i, command in enumerate(plan.agent_commands):
            env = {
                **os.environ,
                **plan.env,
                **plan.job.secret_env,
                **plan.agent_env[i],
                **options.env,
            }
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=options.cwd,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,  # a Ctrl-C in our terminal is ours to forward
            )
            procs.append(proc)
            assert proc.stdout is not None  # stdout=PIPE
            terminal = TerminalFilter(job_failed, stop_after_failure=plan.spec.max_restarts == 0)
            pump = OutputPump(
                proc.stdout,
                Path(plan.log_path(i)),
                i,
                plan.redactor,
                options.on_output,
                terminal,
                prefix=f"[node {i}] " if several else "",
            )
            pump.start()
            pumps.append(pump)
        failed = _wait(procs, options.timeout_s, started)
    finally:
        _stop_all(procs)
        for pump in pumps:
            pump.join(timeout=5.0)
    wall_time_s = time.monotonic() - started
    if failed is not None:
        node, code = failed
        if code is None:
            raise LaunchError(
                f"the local job did not finish within {options.timeout_s:g} s and was stopped; "
                f"logs: {log_dir}"
            )
        worker_error = first_worker_error(log_dir)
        if worker_error is not None:  # the first failing rank's own words
            raise LaunchError(
                f"{plan.redactor.text(worker_error.message)} (worker logs: {log_dir}/)"
            )
        cause = pumps[node].last_error if node < len(pumps) else None
        raise LaunchError(
            f"training failed on simulated node {node} (exit code {code})"
            + (f": {cause}" if cause else "")
            + f"; logs: {plan.log_path(node)}"
        )
    logger.info("local job %s finished in %.1f s", plan.rdzv_id, wall_time_s)
    out = plan.job.output_dir
    return LaunchResult(
        engine="local",
        job_id=plan.rdzv_id,
        status="succeeded",
        run_dir=None if out is None or is_url(out) else out,
        log_location=str(log_dir),
        wall_time_s=wall_time_s,
    )


def _wait(
    procs: list[subprocess.Popen[str]], timeout_s: float | None, started: float
) -> tuple[int, int | None] | None:
    """None when every agent exited 0; else (node, exit code), or (node, None) on timeout."""
    while True:
        codes = [p.poll() for p in procs]
        for node, code in enumerate(codes):
            if code not in (None, 0):
                return node, code
        if all(code == 0 for code in codes):
            return None
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            return 0, None
        time.sleep(_POLL_S)


def _stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Stop the agents still running and every worker they started: SIGTERM to all at once
    (an agent forwards it to its workers), then SIGKILL whatever is left after the grace."""
    running = [p for p in procs if p.poll() is None]
    if not running:
        return
    children: list[psutil.Process] = []
    for proc in running:
        with contextlib.suppress(psutil.NoSuchProcess):
            children += psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for child in children:  # workers in sessions of their own, orphaned by a killed agent
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
