"""Where a training process sits in the job, its share of the node, and the collectives the
trainer needs.

Where the process sits (`DistEnv`) is read from the launcher's environment in one place,
`landcover.distenv.read_dist_env` (re-exported here); everything else receives a
`DistEnv`.

The LOCAL_WORLD_SIZE workers of a node share it: each gets its own GPU (`training_device`), its
share of the cores (`configure_threads`) and of the free memory (`check_shard_fits`).

A world of one is a plain process: no process group, and every collective is a no-op, so the
trainer runs the same code with or without a launcher. Backends: gloo on CPU, NCCL on GPU.
In a job of several nodes the backend talks on the interface `choose_socket_interface` picks
(the launcher's, else the one on the route to the master), set in this process's environment
before the group forms, since gloo and NCCL read it there; ranks that cannot connect stop with
one line naming the master, the interface and the fix.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]
import torch
import torch.distributed as dist
from torch import nn

from landcover.devices import torch_device
from landcover.distenv import SocketChoice, choose_socket_interface
from landcover.distenv import read_dist_env as read_dist_env
from landcover.errors import TrainingError
from tiling.runtime.machine import cores_per_rank
from tiling.runtime.rankenv import DistEnv as DistEnv

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The first collective after the one-time shard load waits for the slowest rank's load, which
# on blob storage can take many minutes; the default 10 min (NCCL) would kill healthy jobs.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=60)
# Fraction of the available RAM a node's shards may take: the model, optimizer, batch tensors,
# allocator slack and the page cache all need the rest.
MEMORY_SAFETY = 0.7


# -- this process's share of the node -----------------------------------------------------------


def configure_threads(threads: int | None, local_world_size: int) -> int:
    """Give each local worker its share of the cores: 2 workers on 2 cores get 1 thread each,
    which is what makes a 1-vs-2-worker epoch time a fair scaling measurement."""
    count = threads or cores_per_rank(local_world_size)
    torch.set_num_threads(count)
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError:  # only settable once, before any inter-op work in this process
        logger.debug("inter-op threads already fixed at %d", torch.get_num_interop_threads())
    return count


def training_device(name: str, env: DistEnv) -> torch.device:
    """`--device auto|cpu|cuda` of a training worker (`landcover.devices.torch_device`):
    local rank r gets GPU r, and a node may not run more workers than GPUs (NCCL cannot
    share one between ranks)."""
    return torch_device(
        name,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        gpu_per_rank=True,
        error=TrainingError,
    )


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_description(device: torch.device) -> str:
    """E.g. "cpu: AMD EPYC 7763" or "cuda: NVIDIA H100 80GB HBM3"."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model_name()}"


def available_memory_bytes() -> int:
    return int(psutil.virtual_memory().available)


def check_shard_fits(
    shard_bytes_for: Callable[[int], int],
    *,
    world_size: int,
    local_world_size: int,
    available_bytes: int,
) -> int:
    """Bytes this rank's shard needs; TrainingError naming the worker count that would fit.

    `shard_bytes_for(w)` is the per-rank shard size with w workers. Adding workers on the same
    node does not help (they share its RAM), so the advice is a total count over more nodes.
    """
    need = shard_bytes_for(world_size)
    budget = available_bytes * MEMORY_SAFETY / local_world_size
    if need <= budget:
        return need
    workers = max(world_size + 1, math.ceil(shard_bytes_for(1) / max(budget, 1.0)))
    while shard_bytes_for(workers) > budget and workers < 1 << 20:
        workers += max(1, workers // 16)
    gib = 1024**3
    raise TrainingError(
        f"each worker's shard needs {need / gib:.2f} GiB with {world_size} workers but only "
        f"{budget / gib:.2f} GiB is free per worker ({available_bytes / gib:.2f} GiB available "
        f"x {MEMORY_SAFETY} / {local_world_size} workers on this node); use at least "
        f"{workers} workers in total (spread over more nodes) or machines with more memory"
    )


def check_sync_bn(sync_bn: bool, env: DistEnv, device: torch.device) -> None:
    """`--sync-bn` needs CUDA: torch's SyncBatchNorm raises on CPU tensors in a process group
    (torch 2.15 accepts CUDA, HPU, XPU and PrivateUse1 devices). One worker has no one to
    synchronise with and trains with plain BatchNorm."""
    if not sync_bn:
        return
    if env.is_distributed and device.type != "cuda":
        raise TrainingError(
            f"--sync-bn needs CUDA devices (torch {torch.__version__.split('+')[0]}'s "
            "SyncBatchNorm does not run on CPU); drop --sync-bn (BatchNorm statistics are "
            "averaged over the workers after every epoch anyway) or use --device cuda"
        )
    if not env.is_distributed:
        logger.warning("one worker: --sync-bn has nothing to synchronise")


# -- the process group ----------------------------------------------------------------------------


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@contextmanager
def process_group(env: DistEnv, device: torch.device) -> Iterator[Collectives]:
    """Join the job's process group for the duration of the block (nothing for a world of 1)."""
    if not env.is_distributed:
        yield Collectives(env, device)
        return
    if dist.is_initialized():
        raise TrainingError("a torch.distributed process group is already running in this process")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = backend_for(device)
    interface = choose_socket_interface(env, backend)
    if interface.chosen and interface.interface is not None:
        # gloo and NCCL read it from the environment when the group forms
        os.environ[interface.variable] = interface.interface
        logger.info("rank %d talks on %s", env.rank, interface.describe())
    # Explicit tcp:// with the values read above, so nothing else consults the environment;
    # under torchrun this still reuses the agent's store at MASTER_ADDR:MASTER_PORT.
    init_method = f"tcp://{env.master_addr}:{env.master_port}"
    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=env.rank,
            world_size=env.world_size,
            timeout=PROCESS_GROUP_TIMEOUT,
        )
    except RuntimeError as exc:
        if not is_connection_failure(exc):
            raise
        raise TrainingError(connection_failure_message(env, interface, exc)) from None
    logger.debug("rank %d/%d joined the %s group", env.rank, env.world_size, backend)
    try:
        yield Collectives(env, device)
    finally:
        dist.destroy_process_group()


def is_connection_failure(exc: BaseException) -> bool:
    """Whether forming the process group failed because ranks could not reach each other (a
    torch.distributed network, store or backend error, or gloo's connectFullMesh)."""
    return isinstance(exc, dist.DistError) or "connect" in str(exc).lower()


def connection_failure_message(env: DistEnv, interface: SocketChoice, exc: BaseException) -> str:
    """One line: which rank could not connect, to which master, on which interface, and the
    fix (the backend's interface variable, slurm.socketInterface in cluster.json)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    return (
        f"rank {env.rank} of {env.world_size} could not connect to the other ranks (master "
        f"{env.master_addr}:{env.master_port}, {interface.describe()}): {first}; set "
        f"{interface.variable} to the interface on which the nodes reach each other (on slurm "
        '"socketInterface" in cluster.json), and check that the master port is open between '
        "the nodes"
    )


class Collectives:
    """The few collectives the trainer uses; all of them are no-ops in a world of one."""

    def __init__(self, env: DistEnv, device: torch.device) -> None:
        self.env = env
        # NCCL only moves CUDA tensors; gloo only CPU ones.
        self.device = (
            device if device.type == "cuda" and env.is_distributed else torch.device("cpu")
        )

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks of a tensor that lives on `self.device`."""
        if self.env.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_floats(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        return [float(v) for v in self.sum_(tensor).cpu()]

    def max_floats(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.env.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [float(v) for v in tensor.cpu()]

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.env.is_distributed:
            return obj
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device)
        result: T = box[0]
        return result

    def gather_objects(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.env.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_to_main(self, obj: T) -> list[T] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        if not self.env.is_distributed:
            return [obj]
        out: list[Any] | None = [None] * self.env.world_size if self.env.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def scatter_from_main(self, objs: list[T] | None) -> T:
        """Rank r receives `objs[r]` of rank 0's list."""
        if not self.env.is_distributed:
            assert objs is not None
            return objs[0]
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs if self.env.is_main else None, src=0)
        result: T = box[0]
        return result

    def broadcast_module(self, module: nn.Module, *, buffers_only: bool = False) -> None:
        """Overwrite every rank's parameters and/or buffers with rank 0's."""
        if not self.env.is_distributed:
            return
        tensors = list(module.buffers())
        if not buffers_only:
            tensors = list(module.parameters()) + tensors
        with torch.no_grad():
            for tensor in tensors:
                dist.broadcast(tensor.data, src=0)

    def average_float_buffers(self, module: nn.Module) -> None:
        """Replace every floating-point buffer (BatchNorm's running mean and variance) by its
        mean over the ranks, in one all-reduce. Integer buffers (`num_batches_tracked`) are
        the same on every rank and stay."""
        if not self.env.is_distributed:
            return
        buffers = [b for b in module.buffers() if b.is_floating_point()]
        if not buffers:
            return
        with torch.no_grad():
            dtype = functools.reduce(torch.promote_types, [b.dtype for b in buffers])
            flat = torch.cat([b.detach().reshape(-1).to(self.device, dtype) for b in buffers])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(self.env.world_size)
            offset = 0
            for buffer in buffers:
                count = buffer.numel()
                buffer.copy_(flat[offset : offset + count].view_as(buffer))
                offset += count

    def barrier(self) -> None:
        if self.env.is_distributed:
            dist.barrier()

    def raise_if_any(self, message: str | None) -> None:
        """Raise the same TrainingError on every rank when any rank has a message."""
        messages = [m for m in self.gather_objects(message) if m]
        if messages:
            raise TrainingError(messages[0])
