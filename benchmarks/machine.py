"""What the benchmarks print about the load of the machine they ran on (shared by the bench
scripts, which run as `python benchmarks/bench_X.py`, so this directory is on their import
path). The CPU's name is `landcover.training.distributed.cpu_model_name`, as every bench
prints it."""

from __future__ import annotations

import os


def load_average() -> float:
    """The 1-minute load average (NaN where the system gives none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
