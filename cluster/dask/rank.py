"""One rank of a job, run inside a Dask worker process: `python -m ENTRY_MODULE ARGV...` as
that process would run it, without starting a process.

The rank's environment (RANK, WORLD_SIZE, MASTER_ADDR, ..., the job's secret environment) is
put into `os.environ` for the run and taken out afterwards, so the entry module reads its place
in the job where every launcher puts it; its stdout, stderr and logging go to the rank's log
file. A worker runs one rank at a time (the engine gives each rank a worker of its own), which
is what makes borrowing the process-wide environment safe. No Dask import here: this module is
what the worker unpickles.
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import socket
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Exit statuses of the worker processes a nanny of this process watched (worker address →
# status: negative for a signal), for the launch to say how a rank's worker died.
_WORKER_EXITS: dict[str, int] = {}


def free_port() -> int:
    """A TCP port free on this worker's host now (the master's, for the rank-0 worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def watch_worker_exit(dask_worker: Any) -> None:
    """Run on a nanny (`Client.run(..., nanny=True)`): remember its worker process's exit
    status when that process ends (the nanny itself only logs it), for `worker_exit`."""
    process = getattr(dask_worker, "process", None)
    address = getattr(dask_worker, "worker_address", None)
    if process is None or address is None or not hasattr(process, "on_exit"):
        return
    nanny_on_exit = process.on_exit

    def remember(exitcode: int) -> None:
        _WORKER_EXITS[address] = exitcode
        nanny_on_exit(exitcode)

    process.on_exit = remember


def worker_exit(address: str, dask_worker: Any = None) -> int | None:
    """Run on a nanny: the exit status of its (former) worker at `address`, if it ended."""
    return _WORKER_EXITS.get(address)


def death_of(exitcode: int | None) -> str:
    """How a worker process ended, in words ("killed by signal 9")."""
    if exitcode is None:
        return "it left the Dask cluster"
    if exitcode < 0:
        return f"killed by signal {-exitcode}"
    return f"its process exited with status {exitcode}"


def run_rank(
    entry_module: str, argv: Sequence[str], environ: Mapping[str, str], log_path: str
) -> int:
    """Run `python -m entry_module argv` in this process with `environ` added, its output
    appended to `log_path`; the exit status it ended with."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    saved_environ = dict(os.environ)
    saved_argv = sys.argv
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    with (
        open(log_path, "a", encoding="utf-8", buffering=1) as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        os.environ.update(environ)
        sys.argv = [entry_module, *argv]
        root.handlers = []  # the entry module sets up its own, writing to this rank's log
        try:
            runpy.run_module(entry_module, run_name="__main__", alter_sys=False)
            status = 0
        except SystemExit as exc:
            status = _exit_status(exc.code, log)
        except BaseException:  # a crash: its traceback stays in the rank's log
            traceback.print_exc(file=log)
            status = 1
        finally:
            for handler in root.handlers:
                if handler not in saved_handlers:
                    handler.close()
            root.handlers, root.level = saved_handlers, saved_level
            sys.argv = saved_argv
            os.environ.clear()
            os.environ.update(saved_environ)
    return status


def _exit_status(code: object, log: object) -> int:
    """sys.exit's argument as a process's exit status (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=log)  # type: ignore[call-overload]
    return 1
