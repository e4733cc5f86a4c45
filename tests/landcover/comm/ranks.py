"""The 2-rank gloo harness of the communication tests: a toy model, its steps, and a runner that
executes a scenario on two spawned ranks and returns what each rank saved.

Multi-process work is costly on 2 cores (torch import and DDP set-up take seconds), so each
test module runs all of its scenarios in one spawned group.
"""

from __future__ import annotations

import datetime
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.multiprocess import free_port, spawn_and_wait

WORLD_SIZE = 2
SPAWN_TIMEOUT_S = 240


def toy_model() -> nn.Module:
    """~42k parameters, with BatchNorm (buffers) and 1-D biases PowerSGD leaves uncompressed."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(4, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 5, 1),
    )


def toy_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    """One optimizer step on this rank's own batch (different data on every rank)."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(4, 4, 11, 13, generator=g)
    y = torch.randint(0, 5, (4, 11, 13), generator=g)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def flat_params(model: nn.Module) -> torch.Tensor:
    """Parameters flattened into one tensor."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def flat_state(model: nn.Module) -> torch.Tensor:
    """Parameters and float buffers (BatchNorm statistics), flattened into one tensor."""
    tensors = [p.detach().reshape(-1) for p in model.parameters()]
    tensors += [b.detach().reshape(-1) for b in model.buffers() if b.is_floating_point()]
    return torch.cat(tensors).clone()


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of every scenario: SGD with momentum."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """Through bytes, as a checkpoint goes: must load with weights_only=True."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def rank_entry(rank: int, worker: Callable[[int], Any], port: int, out_dir: str) -> None:
    """One spawned rank: join the gloo group, run `worker`, save its result to rank<N>.pt."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=60)
    )
    result = worker(rank)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # After DDP, interpreter teardown takes ~5 s per process (measured); the results are saved.
    os._exit(0)


def run_on_two_ranks(worker: Callable[[int], Any], out_dir: Path) -> list[dict[str, Any]]:
    """`worker(rank)` on each of two gloo ranks; the dicts they returned, by rank."""
    spawn_and_wait(
        rank_entry,
        (worker, free_port(), str(out_dir)),
        nprocs=WORLD_SIZE,
        timeout_s=SPAWN_TIMEOUT_S,
        what="2-rank gloo scenarios",
    )
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]
