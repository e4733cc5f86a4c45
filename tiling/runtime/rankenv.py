"""The rank-environment contract: the variables a launcher sets for each rank of a job, and
`DistEnv`, a rank's place in the job read from them (`read_rank_env`).

torchrun, Azure ML, Kubeflow's PyTorchJob and mpirun wrappers set some subset of RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK or GROUP_RANK;
cluster's own launchers (local, dask) set them through `rank_environment`. A process that
`srun` started has SLURM's own instead (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
SLURM_NODEID; tasks per node from SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or the node
count, SLURM_STEP_NUM_NODES or SLURM_JOB_NUM_NODES), read when RANK and WORLD_SIZE are both
absent; MASTER_ADDR/MASTER_PORT then come from the sbatch script (`cluster.slurm.plan` sets
them). The dask engine adds the worker a rank runs in (LANDCOVER_WORKER_ADDRESS, for run.json).
No torch here: the environment is checked before anything heavy is imported;
`landcover.distenv` adds what torch.distributed needs (the network interface).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "GLOO_SOCKET_IFNAME_ENV",
    "GROUP_RANK_ENV",
    "LOCAL_RANK_ENV",
    "LOCAL_WORLD_SIZE_ENV",
    "MASTER_ADDR_ENV",
    "MASTER_PORT_ENV",
    "NCCL_SOCKET_IFNAME_ENV",
    "NODE_RANK_ENV",
    "RANK_ENV",
    "RESTART_COUNT_ENV",
    "WORKER_ADDRESS_ENV",
    "WORLD_SIZE_ENV",
    "DistEnv",
    "RankEnvError",
    "rank_environment",
    "read_rank_env",
]

RANK_ENV = "RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_RANK_ENV = "LOCAL_RANK"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
NODE_RANK_ENV = "NODE_RANK"
GROUP_RANK_ENV = "GROUP_RANK"  # torchrun's name for the node index
MASTER_ADDR_ENV = "MASTER_ADDR"
MASTER_PORT_ENV = "MASTER_PORT"
# the network interface each torch.distributed backend talks on
GLOO_SOCKET_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME_ENV = "NCCL_SOCKET_IFNAME"
WORKER_ADDRESS_ENV = "LANDCOVER_WORKER_ADDRESS"  # the Dask worker a rank runs in
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun for every worker
NODE_NAME_ENV = "SLURMD_NODENAME"


class RankEnvError(ValueError):
    """A launcher variable that is not a number, out of range, or missing beside the others;
    the message names it and the fix (landcover raises it as `LaunchEnvError`)."""


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


def read_rank_env(environ: Mapping[str, str]) -> DistEnv:
    """Read the launcher's variables from `environ`; none set means a world of one. Raises
    `RankEnvError` naming the bad variable and the fix."""
    env = environ
    if not any(env.get(name, "").strip() for name in (RANK_ENV, WORLD_SIZE_ENV)):
        env = {**env, **_from_slurm(env)}

    def integer(name: str, default: int, *, minimum: int) -> int:
        value = _integer(env, name, minimum, fix="fix the launcher")
        return default if value is None else value

    world_size = integer(WORLD_SIZE_ENV, 1, minimum=1)
    rank = integer(RANK_ENV, 0, minimum=0)
    local_rank = integer(LOCAL_RANK_ENV, rank if world_size > 1 else 0, minimum=0)
    local_world_size = integer(LOCAL_WORLD_SIZE_ENV, world_size, minimum=1)
    # torchrun calls the node index GROUP_RANK; most other launchers call it NODE_RANK.
    node_key = NODE_RANK_ENV if env.get(NODE_RANK_ENV, "").strip() else GROUP_RANK_ENV
    node_rank = integer(node_key, rank // local_world_size, minimum=0)
    if rank >= world_size:
        raise RankEnvError(f"RANK={rank} must be < WORLD_SIZE={world_size}; fix the launcher")
    if local_rank >= local_world_size:
        raise RankEnvError(
            f"LOCAL_RANK={local_rank} must be < LOCAL_WORLD_SIZE={local_world_size}; "
            "fix the launcher"
        )
    master_addr = env.get(MASTER_ADDR_ENV, "").strip() or None
    master_port = integer(MASTER_PORT_ENV, 0, minimum=0) or None
    if world_size > 1 and (master_addr is None or master_port is None):
        raise RankEnvError(
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
        node_name=env.get(NODE_NAME_ENV, "").strip() or None,
        gloo_socket_ifname=env.get(GLOO_SOCKET_IFNAME_ENV, "").strip() or None,
        nccl_socket_ifname=env.get(NCCL_SOCKET_IFNAME_ENV, "").strip() or None,
        worker_address=env.get(WORKER_ADDRESS_ENV, "").strip() or None,
    )


def rank_environment(env: DistEnv) -> dict[str, str]:
    """The variables a launcher sets for the rank at `env`'s place (what torchrun would give
    it; MASTER_* when `env` names the master), read back by `read_rank_env`."""
    variables = {
        RANK_ENV: str(env.rank),
        WORLD_SIZE_ENV: str(env.world_size),
        LOCAL_RANK_ENV: str(env.local_rank),
        LOCAL_WORLD_SIZE_ENV: str(env.local_world_size),
        NODE_RANK_ENV: str(env.node_rank),
    }
    if env.master_addr is not None:
        variables[MASTER_ADDR_ENV] = env.master_addr
    if env.master_port is not None:
        variables[MASTER_PORT_ENV] = str(env.master_port)
    if env.worker_address is not None:
        variables[WORKER_ADDRESS_ENV] = env.worker_address
    return variables


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
        raise RankEnvError(
            f"{', '.join(missing)} not set{beside} in an srun step: start the workers with "
            "srun (one task per worker), or set RANK and WORLD_SIZE"
        )

    def integer(name: str, minimum: int) -> int | None:
        return _integer(env, name, minimum, fix="fix the srun launch")

    rank, tasks, local_rank, node = (integer(n, least) or 0 for n, least in _SLURM_TASK.items())
    # the step's own counts (srun may run fewer tasks than the allocation has), else the job's
    nodes = integer("SLURM_STEP_NUM_NODES", 1) or integer("SLURM_JOB_NUM_NODES", 1)
    step_layout = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    uniform = _TASKS_PER_NODE.match(step_layout)
    per_node = int(uniform[1]) if uniform else integer("SLURM_NTASKS_PER_NODE", 1)
    if per_node is None and nodes is not None and tasks % nodes == 0:
        per_node = tasks // nodes
    if (step_layout and not uniform) or per_node is None or (nodes and per_node * nodes != tasks):
        raise RankEnvError(
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
            raise RankEnvError(f"{name}={value} must be < {bound_name} {bound}; fix the launch")
    return {
        RANK_ENV: str(rank),
        WORLD_SIZE_ENV: str(tasks),
        LOCAL_RANK_ENV: str(local_rank),
        LOCAL_WORLD_SIZE_ENV: str(per_node),
        NODE_RANK_ENV: str(node),
    }


def _integer(env: Mapping[str, str], name: str, minimum: int, *, fix: str) -> int | None:
    """The integer in variable `name` (None when unset or blank), at least `minimum`;
    `RankEnvError` naming it and `fix` otherwise."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise RankEnvError(f"{name}={text!r} is not an integer; {fix}") from None
    if value < minimum:
        raise RankEnvError(f"{name}={value} must be >= {minimum}; {fix}")
    return value
