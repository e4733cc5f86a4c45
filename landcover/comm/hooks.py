"""DDP communication hooks: `install_comm_hook` registers the hook of a compression mode.

Compression (`--compression`, one DDP comm hook per mode; every mode installs a hook):

- `none`: torch's plain averaging all-reduce hook (what DDP does without a hook), so that it
  is measured exactly like the others.
- `fp16`: torch's `fp16_compress_hook` (cast to float16, all-reduce, cast back).
- `bf16`: ours, the same cast/all-reduce/cast with bfloat16: torch's `bf16_compress_hook`
  is refused by DDP on anything but NCCL (by function name), while gloo reduces bf16 fine.
- `powersgd[:RANK]`: torch's PowerSGD hook (`landcover.comm.powersgd`).
- `onebit`: 1-bit SGD with error feedback (`landcover.comm.onebit`).

Every hook sends through `CountingCollectives` and is timed by `CommMeter`
(`landcover.comm.meter`, which says what "bytes sent" and "comm time" mean). The modes
themselves are parsed in `landcover.comm.spec`; block momentum (BMUF), which replaces the
gradient all-reduce instead of hooking into it, is in `landcover.comm.bmuf`.
"""

# No `from __future__ import annotations` here: DistributedDataParallel.register_comm_hook
# compares the hook's `bucket` annotation with GradBucket at run time, and a string
# annotation fails that check.

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket  # the same class as dist.GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from landcover.comm.buckets import BucketNames, Future
from landcover.comm.meter import CommMeter, CountingCollectives, StatefulAlgorithm, rebind_module
from landcover.comm.onebit import OneBit
from landcover.comm.powersgd import PowerSGD
from landcover.comm.spec import CompressionMode, CompressionSpec
from landcover.errors import TrainingError

logger = logging.getLogger(__name__)

__all__ = ["install_comm_hook"]


class _Communicate(Protocol):
    def __call__(self, bucket: GradBucket) -> Future: ...


class _MeteredHook:
    """The function DDP calls per bucket: counts steps and times the bucket's communication."""

    def __init__(self, meter: CommMeter, communicate: _Communicate) -> None:
        self._meter = meter
        self._communicate = communicate

    def hook(self, state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        start_s = time.perf_counter()
        self._meter.add_bucket()
        if bucket.is_last():
            self._meter.add_step()
        future = self._communicate(bucket)

        def finished(done: Future) -> torch.Tensor:
            self._meter.add_interval(start_s, time.perf_counter())
            value: torch.Tensor = done.value()
            return value

        return future.then(finished)


class _CastAllReduce:
    """bf16 (or any dtype) cast, averaging all-reduce, cast back; works on gloo and NCCL."""

    def __init__(self, collectives: Any, group: Any, dtype: torch.dtype) -> None:
        self._collectives = collectives
        self._group = group
        self._dtype = dtype

    def __call__(self, bucket: GradBucket) -> Future:
        buffer = bucket.buffer()
        world_size = dist.get_world_size(self._group)
        compressed = buffer.to(self._dtype).div_(world_size)
        work = self._collectives.all_reduce(compressed, group=self._group, async_op=True)

        def decompress(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            buffer.copy_(done.value()[0])
            return buffer

        return cast(Future, work.get_future().then(decompress))


class _NoState:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


def install_comm_hook(ddp_model: nn.Module, spec: CompressionSpec) -> CommMeter:
    """Register the hook for `spec` on a DistributedDataParallel model; returns its meter.

    Call once, before the first backward pass, on every rank.
    """
    if not isinstance(ddp_model, nn.parallel.DistributedDataParallel):
        raise TrainingError(
            f"install_comm_hook needs a DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}; wrap the model in DDP first (or use BlockMomentum)"
        )
    meter = CommMeter(str(spec))
    collectives = CountingCollectives(meter)
    group = ddp_model.process_group
    names = BucketNames(ddp_model.module)
    communicate: _Communicate
    algorithm: StatefulAlgorithm = _NoState()
    if spec.kind in (CompressionMode.NONE, CompressionMode.FP16):
        hooks = rebind_module(default_hooks, collectives, {})
        plain = spec.kind is CompressionMode.NONE
        torch_hook = hooks.allreduce_hook if plain else hooks.fp16_compress_hook

        def communicate(bucket: GradBucket) -> Future:
            return cast(Future, torch_hook(group, bucket))

    elif spec.kind is CompressionMode.BF16:
        communicate = _CastAllReduce(collectives, group, torch.bfloat16)
    elif spec.kind is CompressionMode.ONEBIT:
        onebit = OneBit(collectives, group, names, error_feedback=spec.error_feedback)
        communicate, algorithm = onebit, onebit
    else:
        powersgd = PowerSGD(collectives, group, names, spec)
        communicate, algorithm = powersgd, powersgd
    meter.carry(algorithm)
    ddp_model.register_comm_hook(None, _MeteredHook(meter, communicate).hook)
    logger.info("communication hook: %s", spec)
    return meter
