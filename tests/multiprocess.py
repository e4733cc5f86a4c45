"""Test helpers for multi-process tests: free local ports and a bounded `mp.spawn`."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that were free a moment ago (all held while
    choosing, so none is handed out twice)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    """One TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def spawn_and_wait(
    worker: Callable[..., Any], args: tuple[Any, ...], *, nprocs: int, timeout_s: float, what: str
) -> None:
    """`torch.multiprocessing.spawn(worker, args, nprocs)`, failing the test (and killing the
    processes) when they take over `timeout_s`; `what` names the work in that message."""
    import torch.multiprocessing as mp

    context = mp.spawn(worker, args=args, nprocs=nprocs, join=False)  # type: ignore[attr-defined,no-untyped-call]
    assert context is not None
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} took over {timeout_s:.0f} s")
