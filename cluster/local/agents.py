"""Running a local plan: start its torchrun agents (or, for a job without a process group,
its ranks directly), stream and log their output (redacted), stop them all when one fails or
time runs out, and report the first failing rank's own error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]

from cluster.engine import LaunchOptions, LaunchResult
from cluster.errors import LaunchError
from cluster.failures import clear_worker_errors, first_worker_error
from cluster.local.netns import NodeNetwork
from cluster.local.plan import LocalPlan
from cluster.output import OutputPump, TerminalFilter
from tiling.runtime.urls import is_local

logger = logging.getLogger(__name__)

# Seconds an agent waits after SIGTERM (it forwards it to its workers) before SIGKILL.
STOP_GRACE_S = 10.0
# How often the launcher checks its agents (a waitpid each): it notices the job's end at most
# this late, which a short tile or predict job sees in its wall time.
_POLL_S = 0.05


def run_agents(plan: LocalPlan, options: LaunchOptions) -> LaunchResult:
    """Start the agents (in their nodes' network namespaces when the plan has a network,
    removed after), wait for them all; a LaunchError (one line) if any fails."""
    if plan.network is None:
        return _run_agents(plan, options)
    with NodeNetwork(plan.network):
        return _run_agents(plan, options)


def _run_agents(plan: LocalPlan, options: LaunchOptions) -> LaunchResult:
    log_dir = Path(plan.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for i in range(len(plan.agent_commands)):  # one launch, one set of logs
        Path(plan.log_path(i)).unlink(missing_ok=True)
    clear_worker_errors(log_dir)
    if plan.gpu_note:  # `train --nproc` prints no plan: say why the GPUs go unused
        logger.warning("%s", plan.gpu_note)
    drop_logs = not options.keep_logs and plan.temporary_logs  # kept where a crash needs them
    logger.info(
        "launching %d simulated node(s) x %d process(es)%s; logs in %s%s",
        plan.spec.node_count,
        plan.spec.processes_per_node,
        ", started directly" if plan.direct else "",
        log_dir,
        " (kept if a worker crashes)" if drop_logs else "",
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
                prefix=f"[{plan.unit} {i}] " if several else "",
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
        killed = _killed_rank(plan, node, code)
        if killed is not None and (worker_error is None or not worker_error.bad_input):
            # a rank killed by a signal (the OOM killer, kill -9) writes no error of its own,
            # and the others then fail in a collective: the death is the cause
            rank, signum = killed
            raise LaunchError(
                f"rank {rank} died: killed by signal {signum}{_signal_name(signum)} "
                f"(worker logs: {log_dir}/)",
                worker_error=worker_error,
            )
        if worker_error is not None:  # the first failing rank's own words
            said = replace(worker_error, message=plan.redactor.text(worker_error.message))
            if drop_logs and said.bad_input:  # a refused input: its one line says it all
                shutil.rmtree(log_dir, ignore_errors=True)
                raise LaunchError(said.message, worker_error=said)
            raise LaunchError(f"{said.message} (worker logs: {log_dir}/)", worker_error=said)
        cause = pumps[node].last_error if node < len(pumps) else None
        what = f"rank {node} failed" if plan.direct else f"training failed on simulated node {node}"
        raise LaunchError(
            f"{what} (exit code {code})"
            + (f": {cause}" if cause else "")
            + f"; logs: {plan.log_path(node)}"
        )
    logger.info("local job %s finished in %.1f s", plan.rdzv_id, wall_time_s)
    if plan.temporary_logs:  # a success leaves nothing in $TMPDIR (a failure keeps them)
        shutil.rmtree(log_dir, ignore_errors=True)
    out = plan.job.output_dir
    return LaunchResult(
        engine="local",
        job_id=plan.rdzv_id,
        status="succeeded",
        run_dir=None if out is None or not is_local(out) else out,
        log_location=None if plan.temporary_logs else str(log_dir),
        wall_time_s=wall_time_s,
    )


# torchrun's summary of a failed worker group: the first failure's rank and exit code
_ROOT_CAUSE_RE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)


def _killed_rank(plan: LocalPlan, node: int, code: int) -> tuple[int, int] | None:
    """(rank, signal) of the rank whose death failed the job, if a signal killed it: a rank
    started directly is the failed process itself; under torchrun, the root cause its agent
    logged last (the last attempt's)."""
    if plan.direct:
        return (node, -code) if code < 0 else None
    for i in range(len(plan.agent_commands)):
        try:
            text = Path(plan.log_path(i)).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        causes = _ROOT_CAUSE_RE.findall(text)
        if causes and int(causes[-1][1]) < 0:
            return int(causes[-1][0]), -int(causes[-1][1])
    return None


def _signal_name(signum: int) -> str:
    try:
        return f" ({signal.Signals(signum).name})"
    except ValueError:
        return ""


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
