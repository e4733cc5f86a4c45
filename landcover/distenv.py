"""Where this process sits in the job, and what torch.distributed needs from the launcher.

`read_dist_env` is the ONE place a stage reads its place in the job: the training worker, and
`landcover stage-rank URL` (the ranks of a distributed tile or predict job). The
variables and their parsing are the shared contract (`tiling.runtime.rankenv`: torchrun's
names, or SLURM's under srun); a bad value is a `LaunchEnvError` here. No torch here: the
environment is checked before anything heavy is imported.

The network interface the ranks of a multi-node job talk on is decided here too
(`choose_socket_interface`): the launcher's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when it set
one, else the interface whose address this machine sends from to reach MASTER_ADDR (the
kernel's route, `interface_toward`). Left to itself gloo binds to the address the host name
resolves to, 127.0.0.1 on many machines, and the other nodes cannot reach it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from landcover.errors import LaunchEnvError
from tiling.runtime.rankenv import (
    GLOO_SOCKET_IFNAME_ENV,
    NCCL_SOCKET_IFNAME_ENV,
    DistEnv,
    RankEnvError,
    read_rank_env,
)


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
    """This process's place in the job from the launcher's variables (default: `os.environ`;
    `tiling.runtime.rankenv.read_rank_env`); none set means a world of one. A bad value raises
    `LaunchEnvError` naming the variable and the fix."""
    try:
        return read_rank_env(os.environ if environ is None else environ)
    except RankEnvError as exc:
        raise LaunchEnvError(str(exc)) from None


# the variable each backend takes its network interface from
SOCKET_IFNAME_VARIABLES = {"gloo": GLOO_SOCKET_IFNAME_ENV, "nccl": NCCL_SOCKET_IFNAME_ENV}


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
