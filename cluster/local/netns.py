"""Emulated nodes on one machine: one Linux network namespace per node, each behind a veth
pair on a private bridge, optionally shaped to a link rate.

`NetworkLayout` is the plan (names, subnet, addresses, the `ip`/`tc` commands that build and
remove it) and needs no privileges; `NodeNetwork` builds it (root) and removes it by name on
exit, at interpreter exit, or after a failure half-way. Every name starts with a per-run prefix
(`lc` + 6 hex digits) so two runs, or anything else on the machine, never collide.

A process joins a node with `nsenter --net=/run/netns/NAME` (`NetworkLayout.enter`): unlike
`ip netns exec` it leaves /sys alone, which slurmd needs for its cgroups. Inside every
namespace the node's interface has the same name, `NODE_INTERFACE`, which gloo and NCCL must be
told (`node_env`): left to themselves they pick the hostname's address, 127.0.0.1, and hang.

Name lookups from a node fail at once: c10d and gloo look up the name of each peer's address,
and a namespace reaches no nameserver when the host does not forward, so each lookup would
wait for the resolver to time out (about 10 s). Each namespace gets an
`unreachable` route to the host's IPv4 nameservers (`unreachable_routes`), only where the host
does not forward: there a packet from a node never left the host anyway.

Shaping is `tbf` on both ends of each veth (this kernel has no netem, fq or cake): a node's
egress on its side, its ingress on the bridge side. `tbf`'s own `latency` is a queue bound, not
a delay; a link delay needs the kernel's `netem`, and is refused with a one-line error where the
kernel has none.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cluster._lifecycle import Started
from cluster.errors import ClusterError, ClusterSpecError
from tiling.runtime.rankenv import GLOO_SOCKET_IFNAME_ENV, NCCL_SOCKET_IFNAME_ENV

logger = logging.getLogger(__name__)

NODE_INTERFACE = "lcnet0"
PREFIX_LETTERS = "lc"
# where a run's /24 comes from: far from Docker's 172.17/16 and the usual 10.0/16 and 10.1/16
_SUBNET_POOL = ipaddress.IPv4Network("10.200.0.0/13")
_TBF_QUEUE_BOUND_MS = 20  # tbf's `latency`: how long a packet may wait in the queue
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$")


class NetworkSetupError(ClusterError, RuntimeError):
    """The emulated network cannot be built here (no root, no `ip`, a kernel without a qdisc)."""


def parse_rate(text: str, *, field: str = "network.bandwidth") -> int:
    """A link rate such as "100mbit" or "1gbit" in bits per second (tc's units, in bits)."""
    match = _RATE_RE.match(text.lower()) if isinstance(text, str) else None
    unit = match.group(2) if match else ""
    if match is None or unit not in _RATE_UNITS or float(match.group(1)) <= 0:
        hint = " (tc's 'bps' is bytes per second: write mbit or gbit)" if "bps" in unit else ""
        raise ClusterSpecError(
            f"{field} {text!r} is not a link rate{hint}: write a number and one of "
            f'{", ".join(_RATE_UNITS)}, e.g. "100mbit" or "1gbit"'
        )
    return int(float(match.group(1)) * _RATE_UNITS[unit])


def parse_duration_s(text: str, *, field: str = "network.latency") -> float:
    """A one-way delay such as "2ms" in seconds."""
    match = _DURATION_RE.match(text.lower()) if isinstance(text, str) else None
    if match is None:
        raise ClusterSpecError(
            f'{field} {text!r} is not a delay: write a number and us, ms or s, e.g. "2ms"'
        )
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2)]
    return float(match.group(1)) * scale


def format_rate(bits_per_s: int) -> str:
    """tc's spelling of a rate: the largest unit that keeps it whole."""
    for unit, scale in sorted(_RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"


@dataclass(frozen=True, slots=True)
class LinkShape:
    """What every node's link looks like: a rate, and a one-way delay (netem only)."""

    rate_bits_per_s: int | None = None
    delay_s: float | None = None

    def describe(self) -> str:
        parts = [format_rate(self.rate_bits_per_s) if self.rate_bits_per_s else "unshaped"]
        if self.delay_s:
            parts.append(f"{self.delay_s * 1e3:g} ms one way")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class NetworkLayout:
    """The names, addresses and commands of N emulated nodes; building it is `NodeNetwork`'s."""

    prefix: str
    subnet: str  # a /24: the bridge is .1, node i is .(i + 2)
    nodes: int
    shape: LinkShape = LinkShape()

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def bridge_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}n{i}" for i in range(self.nodes))

    @property
    def addresses(self) -> tuple[str, ...]:
        net = ipaddress.ip_network(self.subnet)
        return tuple(str(net[i + 2]) for i in range(self.nodes))

    def host_veth(self, node: int) -> str:
        return f"{self.prefix}v{node}"

    def enter(self, node: int) -> tuple[str, ...]:
        """The command prefix that runs a program in node `node`'s namespace."""
        return ("nsenter", f"--net=/run/netns/{self.namespaces[node]}", "--")

    def node_env(self) -> dict[str, str]:
        """What a distributed worker inside a node needs to find its interface."""
        return {GLOO_SOCKET_IFNAME_ENV: NODE_INTERFACE, NCCL_SOCKET_IFNAME_ENV: NODE_INTERFACE}

    def describe(self) -> str:
        return (
            f"{self.nodes} network namespace(s) {self.prefix}n0..{self.nodes - 1} on bridge "
            f"{self.bridge} ({self.subnet}), links {self.shape.describe()}, interface "
            f"{NODE_INTERFACE}"
        )

    def setup_commands(self) -> list[list[str]]:
        """The `ip`/`tc` commands that build the network, in order."""
        prefix_len = ipaddress.ip_network(self.subnet).prefixlen
        cmds = [
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.bridge_address}/{prefix_len}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ]
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses, strict=True)):
            host = self.host_veth(i)
            inside = ["ip", "-n", ns]
            cmds += [
                ["ip", "netns", "add", ns],
                [
                    "ip",
                    "link",
                    "add",
                    host,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    NODE_INTERFACE,
                    "netns",
                    ns,
                ],
                ["ip", "link", "set", host, "master", self.bridge, "up"],
                [*inside, "link", "set", "lo", "up"],
                [*inside, "addr", "add", f"{address}/{prefix_len}", "dev", NODE_INTERFACE],
                [*inside, "link", "set", NODE_INTERFACE, "up"],
                # the host's other addresses (where srun listens) are reached through the bridge
                [*inside, "route", "add", "default", "via", self.bridge_address],
            ]
            cmds += self._shaping(["tc"], host) + self._shaping(["tc", "-n", ns], NODE_INTERFACE)
        return cmds

    def _shaping(self, tc: list[str], dev: str) -> list[list[str]]:
        rate, delay = self.shape.rate_bits_per_s, self.shape.delay_s
        if rate is None and delay is None:
            return []
        tbf = []
        if rate is not None:
            # the bucket holds 2 ms at the rate, and at least one 64 KiB GSO segment
            burst = max(rate // 8 // 500, 65536)
            tbf = [
                "tbf",
                "rate",
                format_rate(rate),
                "burst",
                str(burst),
                "latency",
                f"{_TBF_QUEUE_BOUND_MS}ms",
            ]
        if delay is None:
            return [[*tc, "qdisc", "add", "dev", dev, "root", *tbf]]
        netem = [
            *tc,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "handle",
            "1:",
            "netem",
            "delay",
            f"{delay * 1e6:.0f}us",
        ]
        return [netem] + ([[*tc, "qdisc", "add", "dev", dev, "parent", "1:1", *tbf]] if tbf else [])

    def unreachable_routes(self, servers: list[str]) -> list[list[str]]:
        """Routes that make `servers` (nameservers) unreachable from every node at once."""
        return [
            ["ip", "-n", ns, "route", "add", "unreachable", f"{server}/32"]
            for ns in self.namespaces
            for server in servers
        ]

    def teardown_commands(self) -> list[list[str]]:
        """The veths first (a namespace's removal frees its end later, in the background),
        then the namespaces and the bridge."""
        return (
            [["ip", "link", "del", self.host_veth(i)] for i in range(self.nodes)]
            + [["ip", "netns", "del", ns] for ns in self.namespaces]
            + [["ip", "link", "del", self.bridge]]
        )


def new_prefix() -> str:
    """A fresh name prefix: `lc` + 6 hex digits, short enough for 15-character link names."""
    return f"{PREFIX_LETTERS}{os.urandom(3).hex()}"


def plan_network(nodes: int, shape: LinkShape = LinkShape()) -> NetworkLayout:
    """A layout on a /24 that no interface or route of this machine uses now."""
    used = _used_networks()
    rng = random.Random(os.urandom(8))
    candidates = list(_SUBNET_POOL.subnets(new_prefix=24))
    for _ in range(64):
        subnet = rng.choice(candidates)
        if not any(subnet.overlaps(u) for u in used):
            return NetworkLayout(new_prefix(), str(subnet), nodes, shape)
    raise NetworkSetupError(f"no free /24 in {_SUBNET_POOL} for the emulated nodes")


def _used_networks() -> list[ipaddress.IPv4Network]:
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    nets = []
    for route in json.loads(out or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.ip_network(dst, strict=False))
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def silent_nameservers(
    resolv_conf: str = "/etc/resolv.conf", ip_forward: str = "/proc/sys/net/ipv4/ip_forward"
) -> list[str]:
    """The host's IPv4 nameservers a node cannot reach, beyond loopback: all of them when the
    host does not forward (none when it does, or when either file cannot be read)."""
    try:
        if Path(ip_forward).read_text().strip() != "0":
            return []
        lines = Path(resolv_conf).read_text().splitlines()
    except OSError:
        return []
    servers = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        try:
            address = ipaddress.ip_address(fields[1])
        except ValueError:
            continue
        if address.version == 4 and not address.is_loopback and str(address) not in servers:
            servers.append(str(address))
    return servers


def network_unavailable_reason() -> str | None:
    """Why emulated nodes cannot be built here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces, veth, bridge, tc)"
    missing = [tool for tool in ("ip", "tc", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"emulated nodes need {', '.join(missing)}: apt-get install iproute2 util-linux"
    return None


class NodeNetwork(Started):
    """Builds a `NetworkLayout` on enter and removes it on exit (also at interpreter exit, and
    when building fails half-way); processes still inside its namespaces are killed first."""

    def __init__(self, layout: NetworkLayout) -> None:
        self.layout = layout
        self._up = False

    def start(self) -> None:
        reason = network_unavailable_reason()
        if reason is not None:
            raise NetworkSetupError(reason)
        atexit.register(self.stop)
        self._up = True
        try:
            for cmd in self.layout.setup_commands():
                _run(cmd)
            for cmd in self.layout.unreachable_routes(silent_nameservers()):
                _run(cmd)
        except BaseException:
            self.stop()
            raise
        logger.info("emulated network up: %s", self.layout.describe())

    def stop(self) -> None:
        """Kill what runs in the namespaces, remove them and the bridge; safe to call twice."""
        if not self._up:
            return
        self._up = False
        atexit.unregister(self.stop)
        kill_namespace_processes(self.layout.namespaces)
        for cmd in self.layout.teardown_commands():
            subprocess.run(cmd, capture_output=True, check=False)  # absent already: fine


def kill_namespace_processes(namespaces: tuple[str, ...], grace_s: float = 3.0) -> None:
    """SIGTERM every process in these namespaces, then SIGKILL what is left after the grace."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while True:
        pids = [pid for ns in namespaces for pid in namespace_pids(ns)]
        if not pids:
            return
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.1)


def namespace_pids(namespace: str) -> list[int]:
    """The processes in a named network namespace (none when it does not exist)."""
    out = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def remove_by_prefix(prefix: str) -> list[str]:
    """Remove what a run that could not clean up left: the processes in its namespaces, the
    namespaces, and its links (veths, then the bridge). Returns the names removed."""
    namespaces = tuple(n for n in _namespace_names() if n.startswith(prefix))
    links = sorted((n for n in _link_names() if n.startswith(prefix)), key=lambda n: n[-2:] == "br")
    kill_namespace_processes(namespaces)
    for cmd in [["ip", "link", "del", n] for n in links] + [
        ["ip", "netns", "del", n] for n in namespaces
    ]:
        subprocess.run(cmd, capture_output=True, check=False)
    return [*namespaces, *links]


def existing_names(prefix: str) -> list[str]:
    """Namespaces and links whose name starts with `prefix` (to check a teardown)."""
    return [n for n in [*_namespace_names(), *_link_names()] if n.startswith(prefix)]


def _namespace_names() -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=False)
    return [n["name"] for n in json.loads(out.stdout or "[]")]


def _link_names() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=False)
    return [link["ifname"] for link in json.loads(out.stdout or "[]")]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return
    err = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    if "netem" in cmd:  # "Specified qdisc kind is unknown": a kernel built without netem
        raise NetworkSetupError(
            "network.latency needs the kernel's netem qdisc, which this kernel lacks "
            f"({err}); drop network.latency (bandwidth alone works with tbf)"
        )
    raise NetworkSetupError(f"building the emulated network failed: {' '.join(cmd)}: {err}")
