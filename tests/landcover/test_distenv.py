"""The launcher environment, read in one place: torchrun's variables, or SLURM's under srun;
and the network interface a multi-node job's ranks talk on (a fake route table, and real
routes between emulated nodes where network namespaces can be built)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from cluster.local.netns import NODE_INTERFACE, NodeNetwork, plan_network
from landcover.distenv import (
    SocketChoice,
    SocketInterface,
    choose_socket_interface,
    interface_toward,
    pooled_share,
    read_dist_env,
)
from landcover.errors import LaunchEnvError
from tests.conftest import REPO_ROOT
from tiling.runtime.rankenv import DistEnv

TORCHRUN_ENV = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.4",
    "MASTER_PORT": "29500",
}


def test_no_launcher_is_a_world_of_one() -> None:
    env = read_dist_env({})
    assert env == DistEnv()
    assert not env.is_distributed and env.is_main and env.nodes == 1


def test_torchrun_environment() -> None:
    env = read_dist_env(TORCHRUN_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.node_rank, env.nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.4", 29500)
    assert env.is_distributed and not env.is_main


def test_node_rank_is_preferred_to_group_rank() -> None:
    assert read_dist_env({**TORCHRUN_ENV, "NODE_RANK": "3", "GROUP_RANK": "1"}).node_rank == 3


def test_node_rank_defaults_from_rank() -> None:
    env = {k: v for k, v in TORCHRUN_ENV.items() if k != "GROUP_RANK"}
    assert read_dist_env(env).node_rank == 5 // 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"RANK": "8"}, "RANK=8 must be < WORLD_SIZE=8"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 must be < LOCAL_WORLD_SIZE=4"),
        ({"RANK": "-1"}, "RANK=-1 must be >= 0"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR/MASTER_PORT are not set"),
    ],
)
def test_bad_launcher_values_are_named(override: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchEnvError, match=message):
        read_dist_env({**TORCHRUN_ENV, **override})


# what srun gives rank 3 of 2 nodes x 2 tasks, and the sbatch script of `cluster plan` adds
SLURM_ENV = {
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "MASTER_ADDR": "10.0.0.4",
    "MASTER_PORT": "20042",
}


def test_slurm_environment() -> None:
    env = read_dist_env(SLURM_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.4", 20042)


def without(*names: str) -> dict[str, str]:
    return {k: v for k, v in SLURM_ENV.items() if k not in names}


def test_tasks_per_node_from_what_slurm_gives() -> None:
    # from the job's --ntasks-per-node, or from the node count
    assert read_dist_env(without("SLURM_STEP_TASKS_PER_NODE")).local_world_size == 2
    only_counts = without("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
    assert read_dist_env(only_counts).local_world_size == 2
    # a step smaller than the allocation: its own counts, not the job's
    step = {**SLURM_ENV, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "0"}
    step |= {"SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2"}
    assert (read_dist_env(step).world_size, read_dist_env(step).nodes) == (2, 1)


def test_the_batch_script_itself_is_a_world_of_one() -> None:
    # sbatch's batch step has SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but no step id
    assert read_dist_env(without("SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT")) == DistEnv()


def test_torchrun_variables_win_over_slurm() -> None:
    # torchrun started inside a SLURM allocation: its own ranks, not srun's
    env = read_dist_env({**SLURM_ENV, **TORCHRUN_ENV})
    assert (env.rank, env.world_size, env.local_world_size) == (5, 8, 4)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"SLURM_LOCALID": "", "SLURM_NODEID": ""},
            "SLURM_LOCALID, SLURM_NODEID not set beside SLURM_PROCID, SLURM_NTASKS in an srun "
            "step: start the workers with srun",
        ),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not an integer; fix the srun launch"),
        ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 must be >= 1"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 must be < SLURM_NTASKS 4"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 must be < tasks per node 2"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 must be < nodes 2"),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "3,1"},
            "SLURM_NTASKS=4 tasks are not the same number on each of 2 node(s) (tasks per "
            "node: 3,1): submit with --ntasks-per-node",
        ),
        (
            {"SLURM_NTASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "", "SLURM_NTASKS_PER_NODE": ""},
            "SLURM_NTASKS=5 tasks are not the same number on each of 2 node(s) (tasks per "
            "node: (unset))",
        ),
        ({"MASTER_PORT": ""}, "WORLD_SIZE=4 but MASTER_ADDR/MASTER_PORT are not set"),
    ],
)
def test_bad_slurm_values_are_one_line(override: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchEnvError) as info:
        read_dist_env({**SLURM_ENV, **override})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_machines_ranks_are_numbered_in_a_row() -> None:
    env = DistEnv(rank=5, world_size=8, local_rank=1, local_world_size=4)
    assert env.local_ranks == range(4, 8)
    assert DistEnv().local_ranks == range(0, 1)


def test_busy_ranks_pool_the_cores_of_their_machine() -> None:
    # a machine of 3 ranks with 2 threads each; ranks 0 and 2 have work
    machine = range(0, 3)
    assert [pooled_share([0, 2], r, machine, 2) for r in machine] == [3, 2, 3]
    assert [pooled_share([3], r, range(3, 6), 2) for r in range(3, 6)] == [6, 2, 2]
    assert [pooled_share([0, 1], r, range(0, 2), 1) for r in (0, 1)] == [1, 1]  # all busy
    assert pooled_share([], 0, range(0, 2), 4) == 4  # nobody busy: each keeps its own
    with pytest.raises(LaunchEnvError, match=r"rank 4 is not one of this machine's ranks"):
        pooled_share([4], 4, machine, 2)


# --- the interface the ranks talk on ----------------------------------------------------------

# a node with an InfiniBand and two Ethernet networks: (destination, the source address the
# kernel would send from), longest prefix first wins
ROUTES = [
    ("10.1.0.0/16", "10.1.0.7"),
    ("192.168.5.0/24", "192.168.5.20"),
    ("0.0.0.0/0", "172.16.0.3"),
]
INTERFACES = {
    "lo": ["127.0.0.1", "::1"],
    "ib0": ["10.1.0.7"],
    "eth1": ["192.168.5.20"],
    "eth0": ["172.16.0.3", "fe80::1"],
}


def route_table(routes: list[tuple[str, str]]) -> Callable[[str], str]:
    """A fake of the kernel's route lookup: the source address toward `address`."""

    def source_address(address: str) -> str:
        ip = ipaddress.ip_address(address)
        if ip.is_loopback or any(address in found for found in INTERFACES.values()):
            return address if not ip.is_loopback else "127.0.0.1"  # this machine's own
        matching = [(ipaddress.ip_network(net), src) for net, src in routes]
        matching = [(net, src) for net, src in matching if ip in net]
        if not matching:
            raise OSError(101, "Network is unreachable")
        return max(matching, key=lambda m: m[0].prefixlen)[1]

    return source_address


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("10.1.3.9", SocketInterface("ib0", "10.1.0.7")),  # the InfiniBand subnet
        ("192.168.5.1", SocketInterface("eth1", "192.168.5.20")),
        ("8.8.8.8", SocketInterface("eth0", "172.16.0.3")),  # the default route
        ("10.1.0.7", SocketInterface("ib0", "10.1.0.7")),  # the master is this node
        ("127.0.0.1", None),  # loopback says nothing of the other nodes
    ],
)
def test_the_interface_on_the_route_to_the_master(
    master: str, expected: SocketInterface | None
) -> None:
    source = route_table(ROUTES)
    assert interface_toward(master, source_address=source, interfaces=INTERFACES) == expected


def test_no_route_to_the_master_chooses_nothing() -> None:
    source = route_table([("10.1.0.0/16", "10.1.0.7")])
    assert interface_toward("8.8.8.8", source_address=source, interfaces=INTERFACES) is None


def _two_nodes(**extra: str) -> DistEnv:
    return read_dist_env({**TORCHRUN_ENV, **extra})


def test_the_launchers_interface_wins_and_one_node_keeps_the_backends_own() -> None:
    def toward(host: str) -> SocketInterface:
        assert host == "10.0.0.4"
        return SocketInterface("ib0", "10.0.0.9")

    env = _two_nodes()
    assert choose_socket_interface(env, "gloo", toward=toward) == SocketChoice(
        "GLOO_SOCKET_IFNAME", "ib0", "10.0.0.9", chosen=True
    )
    assert choose_socket_interface(env, "nccl", toward=toward).variable == "NCCL_SOCKET_IFNAME"
    given = _two_nodes(GLOO_SOCKET_IFNAME="eth3")
    assert choose_socket_interface(given, "gloo", toward=toward) == SocketChoice(
        "GLOO_SOCKET_IFNAME", "eth3"
    )
    # NCCL's own variable is not gloo's
    assert choose_socket_interface(given, "nccl", toward=toward).interface == "ib0"
    one_node = read_dist_env({**TORCHRUN_ENV, "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "5"})
    assert one_node.nodes == 1
    assert choose_socket_interface(one_node, "gloo", toward=toward) == SocketChoice(
        "GLOO_SOCKET_IFNAME"
    )
    assert choose_socket_interface(env, "gloo", toward=lambda host: None).interface is None


@pytest.mark.usefixtures("require_emulated_nodes")
def test_the_route_between_emulated_nodes_is_their_link() -> None:
    # each node is a network namespace whose host name still resolves to 127.0.0.1: only the
    # route to the master tells which interface the other node reaches
    with NodeNetwork(plan_network(2)) as net:
        layout = net.layout
        code = (
            "import sys; from landcover.distenv import interface_toward as t; "
            "i = t(sys.argv[1]); print(i.name, i.address)"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        for node, master in ((1, layout.addresses[0]), (0, layout.addresses[0])):
            done = subprocess.run(
                [*layout.enter(node), sys.executable, "-c", code, master],
                capture_output=True, text=True, env=env, check=True, timeout=60,
            )  # fmt: skip
            assert done.stdout.split() == [NODE_INTERFACE, layout.addresses[node]]
