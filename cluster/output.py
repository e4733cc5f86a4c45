"""Where the agents' output goes: all of it to the node's log, the progress to the terminal.

Everything a torchrun agent and its workers print goes, redacted, to the node's log file
(`OutputPump`, one thread per agent, which also remembers the last error line it saw). The
terminal gets the progress but not the failure noise: Python tracebacks, each rank's own
`error: ...` line (the same error N times when a check fails on every rank), torchrun's
ChildFailedError report, and the C++ (glog) and gloo lines that follow a dead peer. The
launcher prints the root cause once instead (`cluster.failures`). Without restarts the first
failure ends the job, so after it nothing more is shown at all.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from cluster.redact import Redactor

logger = logging.getLogger(__name__)

# torchrun prefixes worker lines with the rank when asked to ("[rank0]:", "[default0]:")
_RANK_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s?)+")
# the last line of a Python traceback, or a CLI's one-line "error: ..."
_ERROR_LINE = re.compile(
    r"^(?:error: (?P<message>.+)|(?P<exception>[\w.]*\w(?:Error|Exception)\b.*))$"
)
# glog lines of torch's C++ and elastic agent ("E1123 16:21:40.948000 7593 file:line] ...",
# also in brackets, the pid left out by c10d's socket warnings) and gloo's transport logger
# ("[/path/debug_logger.cc:9] ERROR ...")
_GLOG = re.compile(r"^\[?(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? ")
_GLOO = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\] (?:ERROR|WARNING)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct")


def error_message(line: str) -> str | None:
    """The message of an `error: ...` line or of a traceback's last line, else None."""
    text = _RANK_PREFIX.sub("", line)
    if "ChildFailedError" in text:  # torchrun's own report says only "a child failed"
        return None
    match = _ERROR_LINE.match(text)
    if match is None:
        return None
    return match.group("message") or match.group("exception")


class TerminalFilter:
    """Decides, line by line, whether one agent's output line is shown on the terminal.

    One per agent stream (a traceback is a block of lines of one stream); `job_failed` is
    shared by all the agents of a launch and set at the first failure line of any of them.
    With `stop_after_failure` (no restarts) it hides every line after it, on every stream."""

    def __init__(self, job_failed: threading.Event, *, stop_after_failure: bool) -> None:
        self.job_failed = job_failed
        self.stop_after_failure = stop_after_failure
        self._in_traceback = False
        self._after_exception = False  # a chained traceback may follow
        self._report_rules = -1  # "=" rules seen in torchrun's failure report; -1: not in one

    def show(self, line: str) -> bool:
        hidden = self._is_failure_noise(_RANK_PREFIX.sub("", line))
        if self.stop_after_failure and self.job_failed.is_set():
            return False
        return not hidden

    def _is_failure_noise(self, text: str) -> bool:
        if text.startswith("Traceback (most recent call last)"):
            self._failed()
            self._in_traceback, self._after_exception = True, False
            return True
        if self._in_traceback:
            if text and not text[0].isspace() and not text.startswith(_CHAINED):
                # the exception line ends the block
                self._in_traceback, self._after_exception = False, True
                if "ChildFailedError" in text:
                    self._report_rules = 0
            return True
        if self._report_rules >= 0:
            if text.startswith("=" * 10):
                self._report_rules += 1
                if self._report_rules == 2:
                    self._report_rules = -1
            return True
        if self._after_exception:
            if not text.strip() or text.startswith(_CHAINED):
                return True
            self._after_exception = False
        if text.startswith("error: "):
            self._failed()
            return True
        glog = _GLOG.match(text)
        if glog is not None:
            if glog.group("level") in "EF":
                self._failed()
            return True
        return bool(_GLOO.match(text))

    def _failed(self) -> None:
        self.job_failed.set()


class OutputPump(threading.Thread):
    """Copies one agent's output, redacted, to its log file, and what `terminal` lets through
    to on_output (prefixed with the node when there are several)."""

    def __init__(
        self,
        stream: IO[str],
        log_path: Path,
        node: int,
        redactor: Redactor,
        on_output: Callable[[str], None] | None,
        terminal: TerminalFilter,
        *,
        prefix: str,
    ) -> None:
        super().__init__(daemon=True, name=f"landcover-node-{node}")
        self.stream = stream
        self.log_path = log_path
        self.node = node
        self.redactor = redactor
        self.on_output = on_output
        self.terminal = terminal
        self.prefix = prefix
        self.last_error: str | None = None

    def run(self) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            for raw in self.stream:
                line = self.redactor.text(raw.rstrip("\n"))
                log.write(line + "\n")
                log.flush()
                self.last_error = error_message(line) or self.last_error
                if self.terminal.show(line) and self.on_output is not None:
                    try:
                        self.on_output(f"{self.prefix}{line}")
                    except Exception:  # e.g. a closed stdout: keep draining, or the agent blocks
                        logger.exception("output callback failed; node %d logs only", self.node)
                        self.on_output = None
