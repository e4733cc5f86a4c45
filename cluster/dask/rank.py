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

# The Dask worker's address of a rank, for run.json (`landcover.distenv` reads it)


def free_port() -> int:
    """A TCP port free on this worker's host now (the master's, for the rank-0 worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


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
