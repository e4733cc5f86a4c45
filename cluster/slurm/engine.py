"""The slurm engine: submit the plan's sbatch script, follow the job, report how it ended.

`launch` writes the script into the log dir, submits it with `sbatch --parsable` (the job's
secret environment added to sbatch's own, which the job inherits: `--export=ALL`) and, unless
`LaunchOptions.wait` is off, follows it: its state (`scontrol show job`: PENDING, RUNNING, then
COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) and rank 0's log, streamed line by line, redacted,
to `on_output`. A job that does not complete raises `LaunchError` in one line: the first
failing rank's own error (`cluster.failures`) or, when no rank left one (a killed rank), SLURM's
state, the exit code and srun's first error, with the log dir. Ctrl-C or SIGTERM while
following cancels the job (`scancel`) and is raised again; a timeout only stops following.
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from cluster.engine import LaunchOptions, LaunchResult, PlanEngine
from cluster.errors import EngineUnavailableError, LaunchError
from cluster.failures import clear_worker_errors, first_worker_error
from cluster.output import TerminalFilter, error_message
from cluster.slurm.plan import SCRIPT_NAME, SlurmPlan, plan_slurm
from tiling.runtime.atomic import write_text_atomic
from tiling.runtime.urls import is_local

logger = logging.getLogger(__name__)

POLL_S = 1.0  # between two `scontrol show job`: one RPC to the controller each
COMMAND_TIMEOUT_S = 60.0
# the controller may be briefly unreachable (a restart): give up after this many failed queries
MAX_QUERY_FAILURES = 30
FINISHED_OK = "COMPLETED"
# states a job leaves only by ending (SLURM's squeue(1) "JOB STATE CODES")
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
_SRUN_ERROR = re.compile(r"^srun: error: (?P<message>.+)$")
_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True, slots=True)
class JobState:
    """What `scontrol show job` says of a job."""

    state: str  # PENDING, RUNNING, COMPLETED, FAILED, ...; "+" suffixes dropped
    exit_code: int
    signal: int
    nodes: str
    reason: str

    @property
    def finished(self) -> bool:
        return self.state not in _ACTIVE

    def exit_status(self) -> str:
        return f"exit code {self.exit_code}" + (f", signal {self.signal}" if self.signal else "")


def submit(plan: SlurmPlan, options: LaunchOptions) -> LaunchResult:
    """Submit the script; follow the job to its end when `options.wait`."""
    env = {**os.environ, **plan.job.secret_env, **options.env}
    if shutil.which("sbatch", path=env.get("PATH")) is None:
        raise EngineUnavailableError(
            "sbatch not found on PATH: launch from a SLURM login node, or write the script "
            f"with `landcover cluster plan ... --out DIR` and submit {SCRIPT_NAME} there"
        )
    cwd = Path(options.cwd or ".")
    log_dir = cwd / plan.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    clear_worker_errors(log_dir)  # a resubmitted job reports only its own errors
    script = log_dir / SCRIPT_NAME
    write_text_atomic(script, plan.files()[SCRIPT_NAME], mode=0o755)
    started = time.monotonic()
    submitted_at = time.time()
    done = _run(plan.submit_command(str(script)), env, options.cwd)
    if done.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {_first_line(done.stderr or done.stdout)}")
    job_id = done.stdout.strip().split(";")[0]
    _remove_stale_logs(plan, job_id, log_dir, older_than=submitted_at)
    logger.info("submitted SLURM job %s; logs in %s", job_id, log_dir)
    out = plan.job.output_dir
    result = LaunchResult(
        engine="slurm",
        job_id=job_id,
        status="submitted",
        run_dir=None,
        log_location=str(log_dir),
        wall_time_s=0.0,
    )
    if not options.wait:
        return result
    with _cancel_on_interrupt(job_id, env, options.cwd):
        state = _follow(plan, job_id, log_dir, env, options, started)
    if state is None or state.state != FINISHED_OK or state.exit_code or state.signal:
        raise LaunchError(_failure(plan, job_id, log_dir, state))
    wall_time_s = time.monotonic() - started
    logger.info("SLURM job %s finished in %.1f s", job_id, wall_time_s)
    return LaunchResult(
        engine="slurm",
        job_id=job_id,
        status="succeeded",
        run_dir=None if out is None or not is_local(out) else out,
        log_location=str(log_dir),
        wall_time_s=wall_time_s,
    )


def _remove_stale_logs(plan: SlurmPlan, job_id: str, log_dir: Path, *, older_than: float) -> None:
    """Logs of an earlier job with the same id (a re-created cluster, such as the testbed,
    numbers its jobs from 1 again) would be followed and reported as this job's: remove those
    written before this job was submitted."""
    stale = [log_dir / plan.batch_log(job_id).name, *log_dir.glob(plan.rank_log(job_id, "*").name)]
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < older_than:
                path.unlink()


def _run(
    command: list[str], env: Mapping[str, str], cwd: str | None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{command[0]} failed: {exc}") from None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def query_job(job_id: str, env: Mapping[str, str], cwd: str | None) -> JobState | None:
    """The job's state; None when SLURM no longer knows it. LaunchError if scontrol fails."""
    done = _run(["scontrol", "show", "job", "--oneliner", job_id], env, cwd)
    if done.returncode != 0:
        if "invalid job id" in (done.stderr + done.stdout).lower():
            return None
        raise LaunchError(f"scontrol show job {job_id} failed: {_first_line(done.stderr)}")
    fields = dict(_FIELD.findall(done.stdout))
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    return JobState(
        state=fields.get("JobState", "UNKNOWN").split("+")[0],
        exit_code=int(code) if code.isdigit() else 0,
        signal=int(sig) if sig.isdigit() else 0,
        nodes=fields.get("NodeList", ""),
        reason=fields.get("Reason", ""),
    )


def _follow(
    plan: SlurmPlan,
    job_id: str,
    log_dir: Path,
    env: Mapping[str, str],
    options: LaunchOptions,
    started: float,
) -> JobState | None:
    """Poll the job until it ends, streaming rank 0's log; its last state (None: forgotten)."""
    show = _shower(plan, options.on_output)
    tail = _LogTail(log_dir / plan.rank_log(job_id, 0).name)
    seen: list[str] = []

    def announce(state: JobState) -> None:
        if seen and seen[-1] == state.state:
            return
        seen.append(state.state)
        where = f" on {state.nodes}" if state.nodes and state.state != "PENDING" else ""
        why = f" ({state.reason})" if state.reason not in ("", "None") else ""
        _notify(options.on_output, f"[slurm] job {job_id} {state.state}{where}{why}")

    failures = 0
    while True:
        try:
            state = query_job(job_id, env, options.cwd)
            failures = 0
        except LaunchError:  # the controller may be restarting: ask again
            failures += 1
            if failures >= MAX_QUERY_FAILURES:
                raise
            time.sleep(POLL_S)
            continue
        if state is None or state.finished:  # the last lines, then how it ended
            for line in tail.new_lines(final=True):
                show(line)
            if state is not None:
                announce(state)
            return state
        announce(state)  # a new state, then the lines that came with it
        for line in tail.new_lines():
            show(line)
        if options.timeout_s is not None and time.monotonic() - started > options.timeout_s:
            raise LaunchError(
                f"SLURM job {job_id} did not finish within {options.timeout_s:g} s and is still "
                f"{state.state}: follow it with `squeue -j {job_id}` or cancel it with "
                f"`scancel {job_id}`; logs: {log_dir}/"
            )
        time.sleep(POLL_S)


def _notify(on_output: Callable[[str], None] | None, line: str) -> None:
    if on_output is not None:
        on_output(line)


def _shower(plan: SlurmPlan, on_output: Callable[[str], None] | None) -> Callable[[str], None]:
    """Shows rank 0's lines, redacted, without the failure noise (`cluster.output`)."""
    terminal = TerminalFilter(threading.Event(), stop_after_failure=True)

    def show(line: str) -> None:
        text = plan.redactor.text(line)
        if terminal.show(text):
            _notify(on_output, text)

    return show


class _LogTail:
    """The complete lines a growing file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self, *, final: bool = False) -> list[str]:
        try:
            with self.path.open("r", encoding="utf-8", errors="replace") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:  # the rank has not started yet
            return []
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        return [line for line in lines if line or not final]


@contextlib.contextmanager
def _cancel_on_interrupt(job_id: str, env: Mapping[str, str], cwd: str | None) -> Iterator[None]:
    """Ctrl-C or SIGTERM while following: `scancel` the job, then raise again (SIGTERM as
    SystemExit(143), the shell's status for it)."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        logger.warning("interrupted: cancelling SLURM job %s", job_id)
        with contextlib.suppress(LaunchError):
            _run(["scancel", job_id], env, cwd)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _failure(plan: SlurmPlan, job_id: str, log_dir: Path, state: JobState | None) -> str:
    """One line: the first failing rank's error, else SLURM's state and srun's first error."""
    how = (
        f"{state.state}, {state.exit_status()}" if state is not None else "no longer known to SLURM"
    )
    worker_error = first_worker_error(log_dir)
    if worker_error is not None:
        return (
            f"{plan.redactor.text(worker_error.message)} (SLURM job {job_id} {how}; "
            f"worker logs: {log_dir}/)"
        )
    cause = _cause(log_dir / plan.batch_log(job_id).name, log_dir / plan.rank_log(job_id, 0).name)
    return (
        f"SLURM job {job_id} {how}"
        + (f": {plan.redactor.text(cause)}" if cause else "")
        + f"; logs: {log_dir}/"
    )


def _cause(batch_log: Path, rank0_log: Path) -> str | None:
    """srun's first error in the script's output (which task failed, and how), else the last
    error line of the script's output or rank 0's log."""
    last: str | None = None
    for path in (batch_log, rank0_log):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            srun = _SRUN_ERROR.match(line.strip())
            if srun is not None and path == batch_log:
                return srun.group("message")
            last = error_message(line.strip()) or last
        if last is not None:
            return last
    return last


class SlurmEngine(PlanEngine[SlurmPlan]):
    """sbatch on the SLURM cluster of the machine it runs on (a login node)."""

    plan_type = SlurmPlan
    make_plan = staticmethod(plan_slurm)
    run = staticmethod(submit)
