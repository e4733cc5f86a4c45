"""The torch side of the device policy (`tiling.runtime.device`): the GPUs torch sees, and the
`torch.device` a process of train, tune or predict runs on."""

from __future__ import annotations

import torch

from landcover.errors import LandcoverError
from tiling.runtime.device import DeviceChoiceError, choose_device, rank_device_name

__all__ = ["rank_device", "torch_device", "visible_gpu_count"]


def visible_gpu_count() -> int:
    """CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def torch_device(
    text: str,
    *,
    local_rank: int = 0,
    local_world_size: int = 1,
    gpu_per_rank: bool = False,
    error: type[LandcoverError] = LandcoverError,
) -> torch.device:
    """The device for `--device text` of this process (`tiling.runtime.device.choose_device`),
    checked against what is here; a refusal raises `error` (the command's error class)."""
    try:
        name = choose_device(
            text,
            gpu_count=visible_gpu_count(),
            local_rank=local_rank,
            local_world_size=local_world_size,
            gpu_per_rank=gpu_per_rank,
        )
    except DeviceChoiceError as exc:
        raise error(str(exc)) from None
    if name == "mps" and not torch.backends.mps.is_available():
        raise error(f"--device {text}: no MPS device here; use --device cpu")
    return torch.device(name)


def rank_device(text: str, local_rank: int) -> str:
    """The --device of one rank of a job: `auto` or `cuda` become the rank's own GPU
    (`cuda:<local rank mod GPUs>`) when there are GPUs; anything else stays as given."""
    return rank_device_name(text, local_rank, visible_gpu_count())
