"""How a failed worker leaves its one-line error, and how the launcher finds the root cause.

A launcher that sets `LANDCOVER_ERROR_DIR` in the workers' environment asks every worker that
fails to write its one-line error there, as `rank-<RANK>.error` (one JSON object:
`{"rank": 1, "attempt": 0, "time_s": 1767225600.25, "message": "...", "bad_input": true}`,
where `bad_input` says the worker refused its input with one of our one-line errors rather
than crashed). After a failed job the launcher reports one error of the last attempt: where
ranks refused their input, the lowest such rank's (the ranks share the units in order, so it
is the unit one process would have refused first, and the job says what one process says);
else the earliest: the rank that failed first is the cause; the others mostly fail because
it did (a closed connection), and printing all of them would say the same thing N times.

Writer (the worker entry point) and reader (the local engine) share this one definition.
`attempt` is torchrun's restart count, so an error of a group that was restarted and then
failed again is not taken for the new one's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from tiling.runtime.atomic import write_text_atomic
from tiling.runtime.rankenv import RESTART_COUNT_ENV

ERROR_DIR_ENV = "LANDCOVER_ERROR_DIR"
ERROR_SUFFIX = ".error"


@dataclass(frozen=True, slots=True)
class WorkerError:
    """One failed worker: its rank (None if it failed before knowing it), the launcher's
    restart count, when it failed (seconds since the epoch), its one-line message, and whether
    it refused its input (a user's error, said the same by every rank) rather than crashed."""

    rank: int | None
    attempt: int
    time_s: float
    message: str
    bad_input: bool = False


def record_worker_error(
    message: str,
    *,
    rank: int | None,
    bad_input: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """Leave this worker's error where the launcher looks; None when no launcher asked.

    Never raises: a worker that cannot write its error still exits with its own."""
    env = os.environ if environ is None else environ
    directory = env.get(ERROR_DIR_ENV, "").strip()
    if not directory:
        return None
    try:
        attempt = int(env.get(RESTART_COUNT_ENV, "0") or 0)
    except ValueError:
        attempt = 0
    first_line = message.strip().splitlines()[0] if message.strip() else "failed"
    record = WorkerError(
        rank=rank, attempt=attempt, time_s=time.time(), message=first_line, bad_input=bad_input
    )
    name = f"rank-{rank}" if rank is not None else f"pid-{os.getpid()}"
    path = Path(directory) / f"{name}{ERROR_SUFFIX}"
    try:  # atomic: the launcher never reads half a record
        write_text_atomic(path, json.dumps(asdict(record)) + "\n")
    except OSError:
        return None
    return path


def read_worker_errors(error_dir: str | Path) -> list[WorkerError]:
    """Every readable error record in `error_dir` (unreadable ones are skipped)."""
    directory = Path(error_dir)
    if not directory.is_dir():
        return []
    errors: list[WorkerError] = []
    for path in sorted(directory.glob(f"*{ERROR_SUFFIX}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            rank = data.get("rank")
            errors.append(
                WorkerError(
                    rank=None if rank is None else int(rank),
                    attempt=int(data.get("attempt", 0)),
                    time_s=float(data["time_s"]),
                    message=str(data["message"]),
                    bad_input=data.get("bad_input") is True,
                )
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return errors


def first_worker_error(error_dir: str | Path) -> WorkerError | None:
    """The root cause (see the module docstring): of the last attempt, the lowest rank that
    refused its input, else the earliest error; None if no worker wrote one."""
    errors = read_worker_errors(error_dir)
    if not errors:
        return None
    last = max(e.attempt for e in errors)
    latest = [e for e in errors if e.attempt == last]
    refused = [e for e in latest if e.bad_input]
    if refused:
        return min(refused, key=lambda e: (e.rank is None, e.rank or 0, e.time_s))
    return min(latest, key=lambda e: (e.time_s, e.rank or 0))


def clear_worker_errors(error_dir: str | Path) -> None:
    """Remove the records of an earlier launch, so that they are never reported for this one."""
    directory = Path(error_dir)
    if directory.is_dir():
        for path in directory.glob(f"*{ERROR_SUFFIX}"):
            path.unlink(missing_ok=True)
