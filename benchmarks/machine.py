"""What the benchmarks print about the machine they ran on (shared by the bench scripts,
which run as `python benchmarks/bench_X.py`, so this directory is on their import path)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """The 1-minute load average (NaN where the system gives none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
