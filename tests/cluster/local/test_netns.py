"""Emulated nodes: link rates in cluster.json, the namespaces' layout, the measured rate of a
shaped link, teardown by name, and the local engine's agents in namespaces of their own.

Tests that build namespaces need root and iproute2 (`require_emulated_nodes` skips them with
the reason otherwise); the rest check plans and need nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import LaunchOptions, launch_plan, plan_job
from cluster.errors import ClusterSpecError
from cluster.local.netns import (
    NODE_INTERFACE,
    LinkShape,
    NetworkSetupError,
    NodeNetwork,
    existing_names,
    parse_rate,
    plan_network,
    remove_by_prefix,
    silent_nameservers,
)
from cluster.local.plan import LocalPlan
from tests.cluster.fake_worker import fake_job
from tests.conftest import REPO_ROOT

# receiver: accept one connection, read to EOF, print bytes and seconds from first to last byte
_RECEIVER = """
import json, socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
first = conn.recv(1 << 16)
t0, total = time.perf_counter(), 0
while chunk := conn.recv(1 << 16):
    total += len(chunk)
print(json.dumps({"bytes": total, "seconds": time.perf_counter() - t0}), flush=True)
"""
_SENDER = """
import socket, sys
n, block = int(sys.argv[3]), bytes(1 << 16)
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
    for _ in range(n // len(block)):
        s.sendall(block)
"""


@pytest.mark.parametrize(
    ("text", "bits_per_s"),
    [("100mbit", 10**8), ("1gbit", 10**9), ("2.5Gbit", 25 * 10**8), ("500 kbit", 5 * 10**5)],
)
def test_link_rates_are_read_in_tc_units(text: str, bits_per_s: int) -> None:
    assert parse_rate(text) == bits_per_s


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (
            {"bandwidth": "100mbps"},
            "network.bandwidth '100mbps' is not a link rate (tc's 'bps' is bytes per second: "
            "write mbit or gbit): write a number and one of bit, kbit, mbit, gbit, tbit, "
            'e.g. "100mbit" or "1gbit"',
        ),
        ({"bandwidth": "0gbit"}, "network.bandwidth '0gbit' is not a link rate: write a number"),
        ({"latency": "2 days"}, "network.latency '2 days' is not a delay: write a number and us"),
        ({"bandwith": "1gbit"}, "unknown field 'network.bandwith': did you mean 'bandwidth'?"),
    ],
)
def test_a_bad_network_section_is_one_line_naming_the_field(
    network: dict[str, str], message: str
) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec({"targetNodeCount": 2, "network": network})
    assert str(info.value).startswith(f"cluster.json: {message}")
    assert "\n" not in str(info.value)


def test_network_in_cluster_json_puts_each_agent_in_its_own_namespace(tmp_path: Path) -> None:
    doc = {"targetNodeCount": 2, "processesPerNode": 1, "network": {"bandwidth": "1gbit"}}
    spec = parse_cluster_spec(doc)
    assert spec.section == LinkShape(rate_bits_per_s=10**9)
    plan = plan_job(spec, fake_job("s", str(tmp_path / "run")))
    assert isinstance(plan, LocalPlan) and plan.network is not None
    net = plan.network
    assert plan.rdzv_endpoint == f"{net.addresses[0]}:29500"
    for node, command in enumerate(plan.agent_commands):
        assert command[:3] == ("nsenter", f"--net=/run/netns/{net.namespaces[node]}", "--")
        assert f"--local-addr {net.addresses[node]}" in " ".join(command)
        assert plan.agent_env[node]["GLOO_SOCKET_IFNAME"] == NODE_INTERFACE
    assert len(set(net.addresses)) == 2 and net.namespaces[0].startswith(net.prefix)
    assert "links 1gbit" in plan.describe()
    script = plan.files()["torchrun.sh"]
    assert "trap " in script and "tbf rate 1gbit" in script
    for server in silent_nameservers():  # this host's, when it does not forward
        for ns in net.namespaces:
            assert f"ip -n {ns} route add unreachable {server}/32 || exit 1" in script
    # without a network nothing changes: loopback, no namespaces
    plain = plan_job(parse_cluster_spec({"targetNodeCount": 2}), fake_job("s", "r"))
    assert isinstance(plain, LocalPlan) and plain.network is None
    assert plain.rdzv_endpoint.startswith("127.0.0.1:") and "nsenter" not in plain.describe()


def _measure_bits_per_s(net: NodeNetwork, n_bytes: int) -> float:
    layout = net.layout
    receiver = subprocess.Popen(
        [*layout.enter(1), sys.executable, "-c", _RECEIVER, layout.addresses[1]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()
        sender = [*layout.enter(0), sys.executable, "-c", _SENDER, layout.addresses[1], port]
        subprocess.run([*sender, str(n_bytes)], check=True, timeout=30)
        out, _ = receiver.communicate(timeout=30)
    finally:
        receiver.kill()
    result = json.loads(out)
    assert result["bytes"] > n_bytes * 0.9
    return float(result["bytes"]) * 8 / float(result["seconds"])


@pytest.mark.usefixtures("require_emulated_nodes")
def test_a_shaped_link_carries_its_configured_rate_and_leaves_nothing_behind() -> None:
    rate = parse_rate("100mbit")
    layout = plan_network(2, LinkShape(rate_bits_per_s=rate))
    with NodeNetwork(layout) as net:
        assert len(existing_names(layout.prefix)) == 5  # 2 namespaces, 2 veths, 1 bridge
        measured = _measure_bits_per_s(net, n_bytes=25 * 10**6)  # about 2 s at 100 Mbit/s
    print(f"100mbit link: measured {measured / 1e6:.1f} Mbit/s ({measured / rate:.3f})")
    assert abs(measured / rate - 1) <= 0.15
    assert existing_names(layout.prefix) == []


def test_nameservers_a_node_cannot_reach_are_those_of_a_host_that_does_not_forward(
    tmp_path: Path,
) -> None:
    resolv, forward = tmp_path / "resolv.conf", tmp_path / "ip_forward"
    resolv.write_text(
        "# comment\nsearch example.org\nnameserver 10.255.255.53\nnameserver 127.0.0.53\n"
        "nameserver fd00::1\nnameserver 10.255.255.53\nnameserver 192.0.2.7\nnameserver\n"
    )
    forward.write_text("0\n")
    assert silent_nameservers(str(resolv), str(forward)) == ["10.255.255.53", "192.0.2.7"]
    forward.write_text("1\n")  # a forwarding host may reach them: leave DNS alone
    assert silent_nameservers(str(resolv), str(forward)) == []
    assert silent_nameservers(str(tmp_path / "none"), str(tmp_path / "none")) == []
    layout = plan_network(2)
    assert layout.unreachable_routes(["192.0.2.7"]) == [
        ["ip", "-n", ns, "route", "add", "unreachable", "192.0.2.7/32"] for ns in layout.namespaces
    ]


@pytest.mark.usefixtures("require_emulated_nodes")
def test_every_node_fails_a_lookup_of_the_hosts_nameservers_at_once() -> None:
    """Without these routes, each name lookup from a node (c10d and gloo make several) waits
    for the resolver to time out."""
    layout = plan_network(2)
    with NodeNetwork(layout):
        for ns in layout.namespaces:
            shown = subprocess.run(
                ["ip", "-n", ns, "route", "show", "type", "unreachable"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert [a.removesuffix("/32") for a in shown if a[0].isdigit()] == silent_nameservers()
    assert existing_names(layout.prefix) == []


@pytest.mark.usefixtures("require_emulated_nodes")
def test_a_delay_without_netem_is_refused_in_one_line_and_nothing_is_left() -> None:
    layout = plan_network(1, LinkShape(rate_bits_per_s=10**9, delay_s=0.002))
    try:
        with NodeNetwork(layout):
            qdiscs = subprocess.run(
                ["tc", "-n", layout.namespaces[0], "qdisc", "show"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "netem" in qdiscs and "delay 2ms" in qdiscs  # a kernel that has netem
    except NetworkSetupError as exc:  # this one has not
        assert str(exc).startswith("network.latency needs the kernel's netem qdisc")
        assert "\n" not in str(exc)
    assert existing_names(layout.prefix) == []


@pytest.mark.usefixtures("require_emulated_nodes")
def test_what_a_killed_run_left_is_removed_by_its_prefix() -> None:
    layout = plan_network(2)
    net = NodeNetwork(layout)
    net.start()  # and never stopped, as by a run killed with SIGKILL
    sleeper = subprocess.Popen([*layout.enter(1), "sleep", "60"])
    try:
        removed = remove_by_prefix(layout.prefix)
        assert sorted(removed) == sorted(
            [*layout.namespaces, layout.bridge, *map(layout.host_veth, (0, 1))]
        )
        assert sleeper.wait(timeout=10) != 0 and existing_names(layout.prefix) == []
    finally:
        sleeper.kill()
        net.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("require_emulated_nodes")
def test_the_local_engine_all_reduces_across_namespaces(tmp_path: Path) -> None:
    doc = {"targetNodeCount": 2, "processesPerNode": 1, "network": {"bandwidth": "1gbit"}}
    run = tmp_path / "run"
    plan = plan_job(parse_cluster_spec(doc), fake_job("chips.zarr", str(run), "--epochs", "2"))
    assert isinstance(plan, LocalPlan) and plan.network is not None
    prefix = plan.network.prefix
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    launch_plan(plan, LaunchOptions(env=env, cwd=str(REPO_ROOT), timeout_s=240))
    print(f"2-node all-reduce across namespaces: {time.monotonic() - started:.1f} s")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["world_size"], r["nodes"], r["total"]) for r in records] == [
        (2, 2, 3.0),
        (2, 2, 6.0),
    ]
    # the agents joined at node 0's namespace address, not loopback
    assert f"--rdzv-endpoint {plan.network.addresses[0]}:29500" in " ".join(plan.agent_commands[1])
    assert existing_names(prefix) == []


def test_engines_that_cannot_emulate_links_say_so_in_the_plan() -> None:
    """Never a silent no-op: a slurm or remote spec with `network` carries a note saying why."""
    slurm = parse_cluster_spec(
        {"engine": "slurm", "targetNodeCount": 2, "network": {"bandwidth": "1gbit"}}
    )
    assert any("slurm engine ignores it" in note and "--bandwidth" in note for note in slurm.notes)
    local = parse_cluster_spec({"targetNodeCount": 2, "network": {"bandwidth": "1gbit"}})
    assert not any("network" in note for note in local.notes)
