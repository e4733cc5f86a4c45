"""The device policy: which device a process gets from `--device` (train, tune, predict).

Decided without torch, from the count of CUDA devices the caller sees, so that it can be
tested without GPUs and read in one place. `auto` is the process's own GPU when there is one,
else the CPU; `cuda` is its own GPU (local rank r of a node gets GPU r, wrapping round when
`gpu_per_rank` is off); `cuda:N` and `mps` are taken as named. `landcover.devices` turns the
name into a `torch.device`, checking what only torch can tell (MPS).
"""

from __future__ import annotations

import re

__all__ = ["DeviceChoiceError", "check_device_name", "choose_device", "rank_device_name"]

_NAMED = re.compile(r"auto|cpu|cuda|cuda:\d+|mps")


class DeviceChoiceError(ValueError):
    """A `--device` that is not a device landcover runs on, or one this machine lacks; the
    caller raises its own error class with the same one line."""


def check_device_name(text: str) -> None:
    """Raise `DeviceChoiceError` unless `text` is auto, cpu, cuda, cuda:N or mps."""
    if _NAMED.fullmatch(text) is None:
        raise DeviceChoiceError(
            f"--device {text}: landcover predicts on cpu, cuda, cuda:N or mps; use one of them "
            "or auto"
        )


def rank_device_name(text: str, local_rank: int, gpu_count: int) -> str:
    """The device of local rank `local_rank` for `--device text`: `auto` or `cuda` become
    the rank's own GPU (`cuda:<local rank mod GPUs>`) when there are GPUs; anything else
    stays as given (`auto` without GPUs is the CPU once resolved)."""
    if text in ("auto", "cuda") and gpu_count > 0:
        return f"cuda:{local_rank % gpu_count}"
    return text


def choose_device(
    text: str,
    *,
    gpu_count: int,
    local_rank: int = 0,
    local_world_size: int = 1,
    gpu_per_rank: bool = False,
) -> str:
    """The device name ("cpu", "cuda:N" or "mps") for `--device text` of local rank
    `local_rank` of `local_world_size` on a machine with `gpu_count` CUDA devices.
    `gpu_per_rank` (DDP training: NCCL cannot share a GPU between ranks) refuses more ranks
    than GPUs instead of sharing them. Raises `DeviceChoiceError` with the fix."""
    check_device_name(text)
    if text in ("cpu", "mps"):
        return text
    if gpu_count == 0:
        if text == "auto":
            return "cpu"
        raise DeviceChoiceError(f"--device {text} but no CUDA device is visible; use --device cpu")
    if text.startswith("cuda:"):
        if int(text.removeprefix("cuda:")) >= gpu_count:
            raise DeviceChoiceError(f"--device {text}: only {gpu_count} CUDA device(s) here")
        return text
    if gpu_per_rank and local_world_size > gpu_count:
        raise DeviceChoiceError(
            f"{local_world_size} workers on this node but only {gpu_count} GPUs; start at most "
            f"{gpu_count} workers per node or use --device cpu"
        )
    return rank_device_name(text, local_rank, gpu_count)
