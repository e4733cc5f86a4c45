"""What the local engine would run: one torchrun agent per simulated node (`LocalPlan`).

The agents meet through a c10d rendezvous on 127.0.0.1 (a free port); each starts
`processesPerNode` workers with a fair share of the cores (`OMP_NUM_THREADS`) and, when there
are enough GPUs, its own slice of them. With a `network` in the spec, each agent runs in its own
network namespace (`cluster.local.netns`) and the rendezvous is at node 0's address there. The plan
shows all of it, and writes it as `torchrun.sh`, with the job's secrets redacted.

A job whose workers form no process group (`Job.process_group`: tile and predict ranks) on one
simulated node without a network or restarts needs none of that: its ranks are started
directly, one process each with its RANK/WORLD_SIZE (`direct`), which saves torchrun's start.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cluster.engine import Job, job_redactor, threads_per_worker
from cluster.failures import ERROR_DIR_ENV
from cluster.local.netns import LinkShape, NetworkLayout, plan_network, silent_nameservers
from cluster.redact import REDACTED, Redactor
from cluster.spec import ClusterSpec
from tiling.runtime.machine import local_cpu_count, local_gpu_count
from tiling.runtime.rankenv import DistEnv, rank_environment
from tiling.runtime.urls import is_local

LOOPBACK = "127.0.0.1"
# node 0's namespace is fresh: nothing else listens there
NAMESPACE_RDZV_PORT = 29500


@dataclass(frozen=True, slots=True)
class LocalPlan:
    """Everything a local launch does: one command line per simulated node."""

    spec: ClusterSpec
    job: Job
    agent_commands: tuple[tuple[str, ...], ...]
    agent_env: tuple[Mapping[str, str], ...]  # per agent, on top of `env`
    env: Mapping[str, str]
    rdzv_endpoint: str
    rdzv_id: str
    threads_per_worker: int
    cores: int
    log_dir: str
    redactor: Redactor = field(repr=False, compare=False)
    gpu_note: str | None = None
    network: NetworkLayout | None = None  # built at launch (`cluster.local.agents`)
    direct: bool = False  # one command per rank, no torchrun (a job without a process group)
    engine: str = "local"

    @property
    def oversubscribed(self) -> bool:
        """More workers than cores: the measurement says little about real scaling."""
        return self.spec.workers > self.cores

    @property
    def unit(self) -> str:
        """What each command is: a simulated node (a torchrun agent) or, direct, a rank."""
        return "rank" if self.direct else "node"

    def log_path(self, node: int) -> str:
        return str(Path(self.log_dir) / f"{self.unit}-{node}.log")

    @property
    def temporary_logs(self) -> bool:
        """Whether the logs go to a folder of our own in the temporary directory (a job
        without a local output dir), rather than to the job's `logs/`."""
        return self.log_dir == _log_dir(None, self.rdzv_id)

    def describe(self) -> str:
        spec = self.spec
        r = self.redactor
        engine = (
            "local (one process per rank, started directly: the job needs no process group)"
            if self.direct
            else "local (torchrun agents on this machine, c10d rendezvous)"
        )
        lines = [
            f"engine: {engine}",
            f"cluster: {spec.name}: {spec.node_count} simulated node(s) x "
            f"{spec.processes_per_node} process(es) = {spec.workers} worker(s)",
            f"cores: {self.cores}; {self.threads_per_worker} thread(s) per worker"
            + (
                f" (OVERSUBSCRIBED: {spec.workers} workers on {self.cores} cores)"
                if self.oversubscribed
                else ""
            ),
            f"rendezvous: {'none' if self.direct else 'c10d'} at {self.rdzv_endpoint}, "
            f"id {self.rdzv_id}",
            *(
                [f"network: {self.network.describe()} (root; built at launch)"]
                if self.network
                else []
            ),
            _restarts_line(spec),
            *(f"input {k}: {r.text(v)}" for k, v in self.job.inputs.items()),
            *(f"output {k}: {r.text(v)}" for k, v in self.job.outputs.items()),
            f"logs: {Path(self.log_dir) / f'{self.unit}-<i>.log'}",
            "environment: "
            + " ".join(
                [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
                + [f"{k}={REDACTED}" for k in self.job.secret_env]
            ),
        ]
        for i, command in enumerate(self.agent_commands):
            extra = " ".join(f"{k}={v}" for k, v in self.agent_env[i].items())
            shown = f"{extra} {_shell(r.args(command))}" if extra else _shell(r.args(command))
            lines.append(f"{self.unit} {i}: {shown}")
        notes = _notes(spec) + ([self.gpu_note] if self.gpu_note else [])
        lines += [f"note: {n}" for n in notes]
        return "\n".join(lines)

    def files(self) -> dict[str, str]:
        """`torchrun.sh`: the same launch as a shell script (redacted)."""
        r = self.redactor
        out = [
            "#!/usr/bin/env bash",
            f"# landcover cluster plan: engine local, {self.spec.node_count} simulated node(s) x "
            f"{self.spec.processes_per_node} process(es)"
            + (", started directly (no torchrun)" if self.direct else ""),
            "set -u",
            *(f"export {k}={shlex.quote(v)}" for k, v in self.env.items()),
            # secrets are not written here: the workers read them from the environment
            *(
                f': "${{{k}:?export {k} first (secret: kept out of this file)}}"'
                for k in self.job.secret_env
            ),
            f"mkdir -p {shlex.quote(self.log_dir)}",
            *_network_lines(self.network),
            "pids=()",
        ]
        for i, command in enumerate(self.agent_commands):
            extra = "".join(f"{k}={shlex.quote(v)} " for k, v in self.agent_env[i].items())
            out.append(f"{extra}{_shell(r.args(command))} > {shlex.quote(self.log_path(i))} 2>&1 &")
            out.append("pids+=($!)")
        out += [
            "status=0",
            'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
            'exit "$status"',
        ]
        return {"torchrun.sh": "\n".join(out) + "\n"}


def _network_lines(network: NetworkLayout | None) -> list[str]:
    """Build the nodes' namespaces (root), and remove them however the script ends."""
    if network is None:
        return []
    teardown = "; ".join(f"{_shell(c)} 2>/dev/null" for c in network.teardown_commands())
    routes = network.unreachable_routes(silent_nameservers())
    return [
        f"# {network.describe()}",
        f"trap {shlex.quote(teardown)} EXIT",
        *(f"{_shell(c)} || exit 1" for c in network.setup_commands()),
        *(
            ["# name lookups fail at once: the nodes reach no nameserver of this host"]
            if routes
            else []
        ),
        *(f"{_shell(c)} || exit 1" for c in routes),
    ]


def _restarts_line(spec: ClusterSpec) -> str:
    if spec.elastic is None:
        return "restarts: none (a failed worker fails the job)"
    e = spec.elastic
    return (
        f"restarts: up to {e.max_restarts}, nodes {e.min_nodes}..{e.max_nodes}; a restarted "
        "worker group starts again with the same arguments"
    )


def _notes(spec: ClusterSpec) -> list[str]:
    notes = list(spec.notes)
    if spec.mounts:
        notes.append("mounts are not used locally: give the store as a path or URL")
    if spec.setup_command:
        notes.append("setupCommand is not run locally")
    if spec.vm_size != "local":
        notes.append(f"vmSize {spec.vm_size} is only a label here: this machine runs the job")
    return notes


def _shell(argv: list[str]) -> str:
    return shlex.join(argv)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def plan_local(spec: ClusterSpec, job: Job) -> LocalPlan:
    """One torchrun agent command line per simulated node, and their environment."""
    cores = local_cpu_count()
    threads = threads_per_worker(spec) or 1
    shape = spec.section_of(LinkShape)
    network = None if shape is None else plan_network(spec.node_count, shape)
    if network is None:
        addresses = (LOOPBACK,) * spec.node_count
        endpoint = f"{LOOPBACK}:{free_port()}"
    else:
        addresses = network.addresses
        endpoint = f"{addresses[0]}:{NAMESPACE_RDZV_PORT}"
    rdzv_id = f"{spec.name}-{uuid.uuid4().hex[:8]}"
    if spec.elastic is not None and spec.elastic.min_nodes != spec.elastic.max_nodes:
        nnodes = f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}"
    else:
        nnodes = str(spec.node_count)
    args = job.bound_argv()
    log_dir = _log_dir(job.output_dir, rdzv_id)
    agent_env, gpu_note = _gpu_partition(spec)
    direct = not job.process_group and spec.node_count == 1 and network is None
    direct = direct and spec.elastic is None
    commands: list[tuple[str, ...]] = []
    if direct:
        commands = [(sys.executable, "-m", job.entry_module, *args)] * spec.workers
        agent_env = tuple(
            {**agent_env[0], **_rank_env(rank, spec.workers, endpoint)}
            for rank in range(spec.workers)
        )
    for node in range(0 if direct else spec.node_count):
        # is_host pins the rendezvous store on agent 0 instead of a race to bind the port;
        # a short last call: every agent starts at once, none is worth waiting 30 s for
        conf = f"is_host={1 if node == 0 else 0},last_call_timeout=1"
        commands.append(
            (
                *(network.enter(node) if network else ()),
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                nnodes,
                "--nproc-per-node",
                str(spec.processes_per_node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                rdzv_id,
                "--rdzv-conf",
                conf,
                "--local-addr",
                addresses[node],
                "--max-restarts",
                str(spec.max_restarts),
                "-m",
                job.entry_module,
                *args,
            )
        )
    if network is not None:
        agent_env = tuple({**e, **network.node_env()} for e in agent_env)
    env = {
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        # torch shares the rendezvous TCPStore with the workers by default and keeps it
        # across restarts, so restarted workers read the dead group's addresses and
        # hang; a fresh store per round makes elastic restarts work (torch 2.15)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # a failing worker leaves its one-line error there (cluster.failures)
        ERROR_DIR_ENV: log_dir,
    }
    return LocalPlan(
        spec=spec,
        job=job,
        agent_commands=tuple(commands),
        agent_env=agent_env,
        gpu_note=gpu_note,
        network=network,
        direct=direct,
        env=env,
        rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id,
        threads_per_worker=threads,
        cores=cores,
        log_dir=log_dir,
        redactor=job_redactor(spec, job),
    )


def _rank_env(rank: int, world_size: int, endpoint: str) -> dict[str, str]:
    """What torchrun would give rank `rank` of a one-node job (`endpoint` as MASTER_*)."""
    addr, _, port = endpoint.rpartition(":")
    return rank_environment(
        DistEnv(rank, world_size, rank, world_size, master_addr=addr, master_port=int(port))
    )


def _log_dir(out: str | None, rdzv_id: str) -> str:
    if out is None or not is_local(out):  # output on blob storage: the logs stay on this machine
        return str(Path(tempfile.gettempdir()) / f"landcover-launch-{rdzv_id}")
    return str(Path(out) / "logs")


def _gpu_partition(spec: ClusterSpec) -> tuple[tuple[Mapping[str, str], ...], str | None]:
    """Per-agent CUDA_VISIBLE_DEVICES, and a note when the GPUs cannot go round.

    NCCL wants one GPU per worker: each simulated node gets its own slice when there are
    enough; otherwise the GPUs are hidden and every worker trains on CPU (gloo), rather than
    two ranks colliding on one device."""
    gpus = local_gpu_count()
    nodes, per_node = spec.node_count, spec.processes_per_node
    if gpus == 0 or (nodes == 1 and gpus >= per_node):
        return tuple({} for _ in range(nodes)), None
    if gpus < nodes * per_node:
        note = (
            f"{nodes * per_node} workers but {gpus} GPU(s) here: GPUs hidden, workers train on "
            "CPU (NCCL needs one GPU per worker)"
        )
        return tuple({"CUDA_VISIBLE_DEVICES": ""} for _ in range(nodes)), note
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(gpus)]
    return tuple(
        {"CUDA_VISIBLE_DEVICES": ",".join(ids[n * per_node : (n + 1) * per_node])}
        for n in range(nodes)
    ), None
