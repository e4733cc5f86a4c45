"""Facts about this machine: the cores this process may run on and the GPUs it sees, found
without importing torch (cluster never does). The one owner of the core count: tiling's
readers, training's threads, the local engine and the scaling sweep all ask here."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cores_per_rank", "local_cpu_count", "local_gpu_count"]


def local_cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total: a
    container's or a batch scheduler's cpuset is honoured)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def cores_per_rank(local_world_size: int) -> int:
    """The cores one of `local_world_size` ranks on this machine gets when they share its
    cores evenly (at least one): 2 ranks on 2 cores get 1 each."""
    return max(1, local_cpu_count() // max(1, local_world_size))


def local_gpu_count() -> int:
    """NVIDIA GPUs visible here, without importing torch (cluster never does)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0
