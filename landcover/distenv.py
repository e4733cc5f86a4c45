"""Where this process sits in the job (`DistEnv`), read from the launcher's environment.

`read_dist_env` is the ONE place that reads it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, NODE_RANK or GROUP_RANK): torchrun, Azure ML, Kubeflow's PyTorchJob
and mpirun wrappers all set some subset of these. A process that `srun` started has SLURM's own
instead (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID; tasks per node from
SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or the node count, SLURM_STEP_NUM_NODES or
SLURM_JOB_NUM_NODES), read when RANK and WORLD_SIZE are both absent; MASTER_ADDR/MASTER_PORT
then come from the sbatch script (`cluster.slurmplan` sets them). No torch here: the
environment is checked before anything heavy is imported.

The dask engine adds the worker a rank runs in (LANDCOVER_WORKER_ADDRESS, for run.json).

Every stage reads it here: the training worker, and `landcover tile|predict --rank-from-env`
(the ranks of a distributed tile or predict job).

The network interface the ranks of a multi-node job talk on is decided here too
(`choose_socket_interface`): the launcher's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when it set
one, else the interface whose address this machine sends from to reach MASTER_ADDR (the
kernel's route, `interface_toward`). Left to itself gloo binds to the address the host name
resolves to, 127.0.0.1 on many machines, and the other nodes cannot reach it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cluster.daskrank import WORKER_ADDRESS_ENV
from landcover.errors import LaunchEnvError


@dataclass(frozen=True, slots=True)
class DistEnv:
    """This process's place in the job, as the launcher described it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    node_name: str | None = None  # the scheduler's name of this node (SLURM), if it gives one
    # GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME as the launcher set them (None: not set)
    gloo_socket_ifname: str | None = None
    nccl_socket_ifname: str | None = None
    # the Dask worker this rank runs in (the dask engine sets it), if any
    worker_address: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return math.ceil(self.world_size / self.local_world_size)

    @property
    def local_ranks(self) -> range:
        """The ranks on this machine, this one included (launchers number a machine's ranks
        in a row: torchrun, SLURM's default block distribution)."""
        first = self.rank - self.local_rank
        return range(first, first + self.local_world_size)


def pooled_share(busy: Sequence[int], rank: int, local_ranks: range, per_rank: int) -> int:
    """The cores (threads) `rank` runs with when the ranks of its machine (`local_ranks`,
    each given `per_rank`) pool them among the `busy` ones, those with work: an equal share,
    the first busy ranks taking the remainder; `per_rank` for a rank that is not busy."""
    if rank not in local_ranks:
        raise LaunchEnvError(f"rank {rank} is not one of this machine's ranks {local_ranks}")
    working = [r for r in local_ranks if r in busy]
    if rank not in working:
        return per_rank
    each, extra = divmod(per_rank * len(local_ranks), len(working))
    return each + (1 if working.index(rank) < extra else 0)


def read_dist_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read the launcher's variables (default: `os.environ`); none set means a world of one."""
    env = os.environ if environ is None else environ
    if not any(env.get(name, "").strip() for name in ("RANK", "WORLD_SIZE")):
        env = {**env, **_from_slurm(env)}

    def integer(name: str, default: int, *, minimum: int) -> int:
        text = env.get(name, "").strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise LaunchEnvError(f"{name}={text!r} is not an integer; fix the launcher") from None
        if value < minimum:
            raise LaunchEnvError(f"{name}={value} must be >= {minimum}; fix the launcher")
        return value

    world_size = integer("WORLD_SIZE", 1, minimum=1)
    rank = integer("RANK", 0, minimum=0)
    local_rank = integer("LOCAL_RANK", rank if world_size > 1 else 0, minimum=0)
    local_world_size = integer("LOCAL_WORLD_SIZE", world_size, minimum=1)
    # torchrun calls the node index GROUP_RANK; most other launchers call it NODE_RANK.
    node_name = "NODE_RANK" if env.get("NODE_RANK", "").strip() else "GROUP_RANK"
    node_rank = integer(node_name, rank // local_world_size, minimum=0)
    if rank >= world_size:
        raise LaunchEnvError(f"RANK={rank} must be < WORLD_SIZE={world_size}; fix the launcher")
    if local_rank >= local_world_size:
        raise LaunchEnvError(
            f"LOCAL_RANK={local_rank} must be < LOCAL_WORLD_SIZE={local_world_size}; "
            "fix the launcher"
        )
    master_addr = env.get("MASTER_ADDR", "").strip() or None
    master_port = integer("MASTER_PORT", 0, minimum=0) or None
    if world_size > 1 and (master_addr is None or master_port is None):
        raise LaunchEnvError(
            f"WORLD_SIZE={world_size} but MASTER_ADDR/MASTER_PORT are not set; launch with "
            "torchrun (python -m torch.distributed.run) or an sbatch script of "
            "`landcover cluster plan`, or set them"
        )
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        node_name=env.get("SLURMD_NODENAME", "").strip() or None,
        gloo_socket_ifname=env.get(SOCKET_IFNAME_VARIABLES["gloo"], "").strip() or None,
        nccl_socket_ifname=env.get(SOCKET_IFNAME_VARIABLES["nccl"], "").strip() or None,
        worker_address=env.get(WORKER_ADDRESS_ENV, "").strip() or None,
    )


# the variable each backend takes its network interface from
SOCKET_IFNAME_VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


@dataclass(frozen=True, slots=True)
class SocketInterface:
    """A network interface of this machine and its address on it."""

    name: str
    address: str


@dataclass(frozen=True, slots=True)
class SocketChoice:
    """The interface a backend's ranks talk on: `variable` (GLOO_SOCKET_IFNAME or
    NCCL_SOCKET_IFNAME) is to be set to `interface` when `chosen` (here, from the route to the
    master); the launcher's own value otherwise; `interface` None leaves the pick to the backend
    (one node, or no route found)."""

    variable: str
    interface: str | None = None
    address: str | None = None
    chosen: bool = False

    def describe(self) -> str:
        """E.g. `interface eth0 (10.0.0.5, on the route to the master)`."""
        if self.interface is None:
            return "the interface gloo/NCCL pick from the host name"
        where = "on the route to the master" if self.chosen else f"from {self.variable}"
        address = f"{self.address}, " if self.address else ""
        return f"interface {self.interface} ({address}{where})"


def choose_socket_interface(
    env: DistEnv,
    backend: str,
    *,
    toward: Callable[[str], SocketInterface | None] | None = None,
) -> SocketChoice:
    """The interface `backend` ("gloo" or "nccl") should use on this node: the launcher's
    setting, else, in a job of several nodes, the one on the route to MASTER_ADDR
    (`interface_toward`, or `toward` in tests); a job on one node keeps the backend's own."""
    variable = SOCKET_IFNAME_VARIABLES[backend]
    given = env.nccl_socket_ifname if backend == "nccl" else env.gloo_socket_ifname
    if given is not None:
        return SocketChoice(variable, given)
    if env.nodes < 2 or env.master_addr is None:
        return SocketChoice(variable)
    found = (toward or interface_toward)(env.master_addr)
    if found is None:
        return SocketChoice(variable)
    return SocketChoice(variable, found.name, found.address, chosen=True)


def interface_toward(
    host: str,
    *,
    source_address: Callable[[str], str] | None = None,
    interfaces: Mapping[str, Sequence[str]] | None = None,
) -> SocketInterface | None:
    """The interface whose address this machine sends from to reach `host`, by the kernel's
    routes (`source_address`: a UDP socket's connect() picks it and sends nothing), among
    `interfaces` (name → addresses, psutil's by default). None when `host` does not resolve,
    has no route, or is reached over loopback (then the host is this machine, named by a
    loopback name: no route says which interface the other nodes reach)."""
    try:
        address = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0][4][0]
        source = (source_address or _source_address)(str(address))
    except OSError:
        return None
    if ipaddress.ip_address(source).is_loopback:
        return None
    for name, addresses in (interfaces or _interface_addresses()).items():
        if source in addresses:
            return SocketInterface(name, source)
    return None


def _source_address(address: str) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))  # a UDP connect() routes, it sends nothing
        return str(probe.getsockname()[0])


def _interface_addresses() -> dict[str, list[str]]:
    """Every interface of this machine and its IPv4 and IPv6 addresses (psutil)."""
    import psutil  # type: ignore[import-untyped]

    families = (socket.AF_INET, socket.AF_INET6)
    return {
        name: [a.address.split("%")[0] for a in found if a.family in families]
        for name, found in psutil.net_if_addrs().items()
    }


# srun's task variables, and the least each may be
_SLURM_TASK = {"SLURM_PROCID": 0, "SLURM_NTASKS": 1, "SLURM_LOCALID": 0, "SLURM_NODEID": 0}
# "2(x3)" (2 tasks on each of 3 nodes), "2", or "2,1" (uneven) in SLURM_STEP_TASKS_PER_NODE
_TASKS_PER_NODE = re.compile(r"^(\d+)(?:\(x\d+\))?$")


def _from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """SLURM's task variables under torchrun's names; {} unless srun started this process.

    Only a job step has SLURM_STEP_ID: the batch script itself also has SLURM_PROCID=0 and
    the allocation's SLURM_NTASKS, but it is one process, not rank 0 of them."""
    if not env.get("SLURM_STEP_ID", "").strip():
        return {}
    given = [name for name in _SLURM_TASK if env.get(name, "").strip()]
    missing = [name for name in _SLURM_TASK if name not in given]
    if missing:
        beside = f" beside {', '.join(given)}" if given else ""
        raise LaunchEnvError(
            f"{', '.join(missing)} not set{beside} in an srun step: start the workers with "
            "srun (one task per worker), or set RANK and WORLD_SIZE"
        )

    def integer(name: str, minimum: int) -> int | None:
        text = env.get(name, "").strip()
        if not text:
            return None
        try:
            value = int(text)
        except ValueError:
            raise LaunchEnvError(
                f"{name}={text!r} is not an integer; fix the srun launch"
            ) from None
        if value < minimum:
            raise LaunchEnvError(f"{name}={value} must be >= {minimum}; fix the srun launch")
        return value

    rank, tasks, local_rank, node = (integer(n, least) or 0 for n, least in _SLURM_TASK.items())
    # the step's own counts (srun may run fewer tasks than the allocation has), else the job's
    nodes = integer("SLURM_STEP_NUM_NODES", 1) or integer("SLURM_JOB_NUM_NODES", 1)
    step_layout = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    uniform = _TASKS_PER_NODE.match(step_layout)
    per_node = int(uniform[1]) if uniform else integer("SLURM_NTASKS_PER_NODE", 1)
    if per_node is None and nodes is not None and tasks % nodes == 0:
        per_node = tasks // nodes
    if (step_layout and not uniform) or per_node is None or (nodes and per_node * nodes != tasks):
        raise LaunchEnvError(
            f"SLURM_NTASKS={tasks} tasks are not the same number on each of "
            f"{nodes or '(unknown)'} node(s) (tasks per node: "
            f"{step_layout or per_node or '(unset)'}): submit with --ntasks-per-node, as the "
            "script of `landcover cluster plan` does"
        )
    checks = (
        ("SLURM_PROCID", rank, "SLURM_NTASKS", tasks),
        ("SLURM_LOCALID", local_rank, "tasks per node", per_node),
        ("SLURM_NODEID", node, "nodes", nodes or tasks // per_node),
    )
    for name, value, bound_name, bound in checks:
        if value >= bound:
            raise LaunchEnvError(f"{name}={value} must be < {bound_name} {bound}; fix the launch")
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(tasks),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(per_node),
        "NODE_RANK": str(node),
    }
