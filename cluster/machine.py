"""Facts about this machine that the local engine and resource shares need, found without
importing torch (cluster never does)."""

from __future__ import annotations

import os
from pathlib import Path


def local_cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def local_gpu_count() -> int:
    """NVIDIA GPUs visible here, without importing torch (cluster never does)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0
