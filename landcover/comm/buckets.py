"""Per-bucket state of DDP communication hooks, keyed by parameter names.

Error-feedback state (onebit residuals; PowerSGD errors and warm-start Q matrices) is kept per
bucket but keyed by the names of the bucket's parameters, not by bucket index. DDP rebuilds its
buckets after the first iteration (and again after every restart), so an index names different
parameters at different times; with name keys, state of a bucket that no longer exists is split
back into per-parameter pieces (`split_state`) and reassembled for the new buckets
(`join_state`). `CommMeter.state_dict()` stores this state per parameter, so a checkpoint
resumed with a different bucket layout continues exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch._C._distributed_c10d import GradBucket  # the same class as dist.GradBucket

__all__ = ["BucketKey", "BucketNames", "Future", "KeyedBucket", "join_state", "split_state"]

Future = torch.futures.Future[torch.Tensor]
BucketKey = tuple[str, ...]


def split_state(flat: torch.Tensor, names: Sequence[str], lengths: Sequence[int]) -> dict[str, Any]:
    """`flat` cut into one detached copy per parameter name (`lengths` elements each)."""
    return {
        name: piece.detach().clone()
        for name, piece in zip(names, torch.split(flat, list(lengths)), strict=True)
    }


def join_state(
    pending: dict[str, torch.Tensor],
    names: Sequence[str],
    lengths: Sequence[int],
    like: torch.Tensor,
    *,
    require_all: bool,
) -> torch.Tensor | None:
    """Concatenate (and remove) the pending pieces for `names`; zeros where one is missing."""
    present = [name in pending for name in names]
    if not any(present) or (require_all and not all(present)):
        return None
    pieces = [
        pending.pop(name).reshape(-1).to(device=like.device, dtype=like.dtype)
        if name in pending
        else torch.zeros(length, device=like.device, dtype=like.dtype)
        for name, length in zip(names, lengths, strict=True)
    ]
    return torch.cat(pieces)


class BucketNames:
    """Maps a DDP bucket to the names of its parameters (the stable key of its state)."""

    def __init__(self, module: nn.Module) -> None:
        self._params = dict(module.named_parameters())  # keeps the ids below alive
        self._names = {id(p): name for name, p in self._params.items()}

    def key(self, bucket: GradBucket) -> BucketKey:
        try:
            return tuple(self._names[id(p)] for p in bucket.parameters())
        except KeyError:
            raise RuntimeError("a DDP bucket holds a parameter the model does not name") from None


class KeyedBucket:
    """A GradBucket whose `index()` is its parameter-name key, for torch's PowerSGD hook,
    which keys its error-feedback and warm-start dicts by `bucket.index()`."""

    def __init__(self, bucket: GradBucket, key: BucketKey) -> None:
        self._bucket = bucket
        self._key = key

    def index(self) -> BucketKey:
        return self._key

    def buffer(self) -> torch.Tensor:
        return self._bucket.buffer()

    def gradients(self) -> list[torch.Tensor]:
        return self._bucket.gradients()

    def parameters(self) -> list[torch.Tensor]:
        return self._bucket.parameters()

    def is_last(self) -> bool:
        return self._bucket.is_last()

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._bucket.set_buffer(tensor)
