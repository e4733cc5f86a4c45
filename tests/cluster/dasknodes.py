"""A real Dask cluster on emulated nodes, for the tests: `dask scheduler` on this machine at
the bridge's address, and one `dask worker` (with its nanny) inside each node's network
namespace (`cluster.local.netns`), so the workers reach the scheduler and each other over the
emulated network, as workers on separate machines do. Needs root (see
`cluster.local.netns.network_unavailable_reason`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from cluster.local.netns import NetworkLayout, NodeNetwork, plan_network

REPO_ROOT = Path(__file__).resolve().parents[2]
DASK = str(Path(sys.executable).with_name("dask"))
START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class DaskNodes:
    """The running cluster: its scheduler's address and the emulated network."""

    scheduler: str
    layout: NetworkLayout
    workers: tuple[subprocess.Popen[bytes], ...]
    log_dir: Path


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextmanager
def dask_nodes(
    log_dir: Path, nodes: int = 2, *, worker_env: Mapping[int, Mapping[str, str]] | None = None
) -> Iterator[DaskNodes]:
    """Start the scheduler and one worker per node; stop everything on exit. `worker_env`:
    extra environment for node i's worker."""
    from distributed import Client

    log_dir.mkdir(parents=True, exist_ok=True)
    layout = plan_network(nodes)
    with ExitStack() as stack:
        stack.enter_context(NodeNetwork(layout))
        host = layout.bridge_address
        address = f"tcp://{host}:{_free_port(host)}"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        procs: list[subprocess.Popen[bytes]] = []

        def start(command: list[str], log: str, extra: Mapping[str, str]) -> None:
            out = stack.enter_context(open(log_dir / log, "wb"))
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env={**env, **extra}
            )
            procs.append(proc)

        port = address.rsplit(":", 1)[1]
        start([DASK, "scheduler", "--host", host, "--port", port, "--no-dashboard"],
              "scheduler.log", {})  # fmt: skip
        for i, node_address in enumerate(layout.addresses):
            command = [*layout.enter(i), DASK, "worker", address, "--nthreads", "1",
                       "--host", node_address, "--no-dashboard", "--name", f"node{i}"]  # fmt: skip
            start(command, f"worker-{i}.log", (worker_env or {}).get(i, {}))
        stack.callback(_stop, procs)
        with Client(address, timeout="60s") as client:  # type: ignore[no-untyped-call]
            client.wait_for_workers(nodes, timeout=START_TIMEOUT_S)
        yield DaskNodes(address, layout, tuple(procs[1:]), log_dir)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
