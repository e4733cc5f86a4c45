"""A real SLURM cluster on this machine, for tests and demos: one `slurmctld` and N `slurmd`,
each slurmd in its own network namespace (`cluster.local.netns`) with its own address on a bridge.

    with SlurmTestbed(nodes=2, bandwidth="100mbit") as bed:
        subprocess.run(["srun", "-N2", "hostname"], env={**os.environ, **bed.env})

Daemons come from Debian's `slurm-wlm` (installed with apt-get when missing), authenticate with
`auth/none` (no munge) and run in the foreground under this process, with a slurm.conf, state,
spool, pid and log files in a fresh temporary directory. Several slurmd share the host through
Debian's MULTIPLE_SLURMD build (`slurmd -N nI`); each listens on its namespace's address, so the
tasks of a job on different nodes talk over a real network stack. The controller listens on the
bridge's address and a free port, so testbeds of two runs can live side by side.

`stop()` (also on exit, at interpreter exit, or when starting fails) stops the slurmd before the
controller, reaps them, kills what is left in the namespaces, and removes the namespaces, the
bridge and the temporary directory.

For people, from the repository root: `python -m tests.support.slurm_testbed up [--nodes N]
[--bandwidth 1gbit]` (`make cluster-up`) runs one until Ctrl-C and prints the SLURM_CONF to
export; `python -m tests.support.slurm_testbed down PREFIX` (`make cluster-down PREFIX=lc...`)
removes what an `up` killed without its cleanup left.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster._lifecycle import Started
from cluster.errors import ClusterError
from cluster.local.netns import (
    NODE_INTERFACE,
    LinkShape,
    NetworkLayout,
    NodeNetwork,
    network_unavailable_reason,
    parse_rate,
    plan_network,
    remove_by_prefix,
)
from tests.support.paths import REPO_ROOT

SLURM_PACKAGE = "slurm-wlm"
_DAEMONS = ("slurmctld", "slurmd", "srun", "sinfo", "scontrol")
_APT_TIMEOUT_S = 300.0
_IDLE_TIMEOUT_S = 30.0
_STOP_GRACE_S = 5.0


class SlurmUnavailableError(ClusterError, RuntimeError):
    """The testbed cannot run here; the message (one line) says why."""


def ensure_slurm_installed() -> None:
    """Install slurm-wlm with apt-get when its daemons are missing (root only)."""
    if all(shutil.which(tool) for tool in _DAEMONS):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailableError(
            f"SLURM daemons missing and cannot be installed here (needs root and apt-get): "
            f"apt-get install {SLURM_PACKAGE}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=240",
        SLURM_PACKAGE,
    ]
    proc = subprocess.run(
        install, capture_output=True, text=True, env=env, timeout=_APT_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:  # a fresh machine has no package lists yet
        subprocess.run(
            ["apt-get", "update", "-q"],
            capture_output=True,
            env=env,
            timeout=_APT_TIMEOUT_S,
            check=False,
        )
        proc = subprocess.run(
            install, capture_output=True, text=True, env=env, timeout=_APT_TIMEOUT_S, check=False
        )
    if proc.returncode != 0 or not all(shutil.which(tool) for tool in _DAEMONS):
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SlurmUnavailableError(f"apt-get install {SLURM_PACKAGE} failed: {last}")


def slurm_testbed_unavailable_reason() -> str | None:
    """Why a testbed cannot start here (one line), or None; installs slurm-wlm if it can."""
    reason = network_unavailable_reason()
    if reason is not None:
        return reason
    try:
        ensure_slurm_installed()
    except SlurmUnavailableError as exc:
        return str(exc)
    return None


class SlurmTestbed(Started):
    """A running SLURM cluster of `nodes` emulated nodes (context manager).

    `.env`: what a client (srun, sbatch, squeue, scancel) needs, SLURM_CONF and PATH;
    `.nodes`: (node name, address) per node; `.interface`: the interface inside every node,
    for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME; `.conf_path`, `.controller_address`,
    `.partition`, `.layout` (the `NetworkLayout`)."""

    partition = "debug"
    interface = NODE_INTERFACE

    def __init__(
        self, nodes: int = 2, *, bandwidth: str | None = None, cpus_per_node: int = 1
    ) -> None:
        if nodes < 1 or cpus_per_node < 1:
            raise ClusterError(
                f"a testbed needs nodes >= 1 and cpus_per_node >= 1, got "
                f"{nodes} and {cpus_per_node}"
            )
        rate = parse_rate(bandwidth) if bandwidth is not None else None
        self.layout: NetworkLayout = plan_network(nodes, LinkShape(rate_bits_per_s=rate))
        self.cpus_per_node = cpus_per_node
        self.nodes: list[tuple[str, str]] = [
            (f"n{i}", address) for i, address in enumerate(self.layout.addresses)
        ]
        self._network = NodeNetwork(self.layout)
        self._dir: Path | None = None
        self._controller: subprocess.Popen[bytes] | None = None
        self._slurmds: list[subprocess.Popen[bytes]] = []
        self.startup_s = 0.0

    @property
    def controller_address(self) -> str:
        return self.layout.bridge_address

    @property
    def conf_path(self) -> Path:
        if self._dir is None:
            raise ClusterError("the testbed is not running: use it as a context manager")
        return self._dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        path = os.environ.get("PATH", "")
        return {"SLURM_CONF": str(self.conf_path), "PATH": f"/usr/bin:/usr/sbin:{path}"}

    def start(self) -> None:
        """Build the network, write slurm.conf, start the daemons, wait for idle nodes."""
        reason = slurm_testbed_unavailable_reason()
        if reason is not None:
            raise SlurmUnavailableError(reason)
        started = time.monotonic()
        atexit.register(self.stop)
        try:
            self._dir = Path(tempfile.mkdtemp(prefix=f"{self.layout.prefix}-slurm-"))
            self._network.start()
            port = _free_port(self.controller_address)
            for sub in ("state", "spool"):
                (self._dir / sub).mkdir()
            self.conf_path.write_text(self.slurm_conf(port))
            env = {**os.environ, **self.env}
            logs = self._dir / "daemons.out"
            with logs.open("ab") as out:
                self._controller = subprocess.Popen(
                    ["slurmctld", "-D", "-i"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                for i, (name, _) in enumerate(self.nodes):
                    self._slurmds.append(
                        subprocess.Popen(
                            [*self.layout.enter(i), "slurmd", "-D", "-N", name],
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    )
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def slurm_conf(self, port: int) -> str:
        """slurm.conf of this testbed (controller on the bridge's address and `port`)."""
        assert self._dir is not None
        d = self._dir
        host = socket.gethostname()
        lines = [
            f"ClusterName={self.layout.prefix}",
            f"SlurmctldHost={host}({self.controller_address})",
            f"SlurmctldPort={port}",
            "SlurmdPort=6818",  # one per namespace: the same number does not collide
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool' / '%n'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            *(
                f"NodeName={name} NodeHostname={host} NodeAddr={address} "
                f"CPUs={self.cpus_per_node} State=UNKNOWN"
                for name, address in self.nodes
            ),
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + _IDLE_TIMEOUT_S
        env = {**os.environ, **self.env}
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for proc in [self._controller, *self._slurmds]:
                if proc is not None and proc.poll() is not None:
                    raise SlurmUnavailableError(
                        f"{_command_line(proc)} exited at start (code "
                        f"{proc.returncode}): {self._last_error()}"
                    )
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise SlurmUnavailableError(
            f"SLURM nodes not idle after {_IDLE_TIMEOUT_S:g} s ({states or 'no answer'}): "
            f"{self._last_error()}"
        )

    def _last_error(self) -> str:
        """The daemons' last error line (their logs go with the temp dir on failure)."""
        assert self._dir is not None
        lines: list[str] = []
        for log in [*sorted(self._dir.glob("*.log")), self._dir / "daemons.out"]:
            with contextlib.suppress(OSError):
                lines += log.read_text(errors="replace").splitlines()
        fatal = [ln for ln in lines if "fatal" in ln.lower()]
        errors = fatal or [ln for ln in lines if "error" in ln.lower()] or lines or ["no log"]
        return errors[-1].strip()

    def stop(self) -> None:
        """slurmd first, then slurmctld (each reaped), then the network and the temp dir."""
        atexit.unregister(self.stop)
        for proc in self._slurmds:
            _terminate(proc)
        self._slurmds = []
        if self._controller is not None:
            _terminate(self._controller)
            self._controller = None
        self._network.stop()  # also kills slurmstepd and job tasks left in the namespaces
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def daemon_pids(self) -> list[int]:
        """PIDs of the running daemons (slurmctld first)."""
        procs = [self._controller, *self._slurmds]
        return [p.pid for p in procs if p is not None]


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _command_line(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, list) else str(args)


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def remove_testbed(prefix: str) -> list[str]:
    """Remove a testbed its own process could not stop (killed): its slurmd and everything in
    its namespaces, the namespaces and links, its slurmctld, its temporary directory."""
    if not re.fullmatch(r"lc[0-9a-f]{6}", prefix):
        raise ClusterError(f"{prefix!r} is not a testbed prefix: give the lcXXXXXX that up printed")
    removed = remove_by_prefix(prefix)
    for state_dir in Path(tempfile.gettempdir()).glob(f"{prefix}-slurm-*"):
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            pid = int((state_dir / "slurmctld.pid").read_text())
            if "slurmctld" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(str(state_dir))
    return removed


def two_node_slurm_job(testbed: SlurmTestbed, folder: Path) -> tuple[Path, dict[str, str]]:
    """A slurm.json in `folder` for the testbed's two nodes (one rank each), and the
    environment under which its nodes run this interpreter on this checkout (sbatch passes
    the submitting environment on)."""
    cluster_json = folder / "slurm.json"
    cluster_json.write_text(
        json.dumps(
            {
                "engine": "slurm",
                "targetNodeCount": 2,
                "processesPerNode": 1,
                "slurm": {"timeLimit": "00:08:00", "socketInterface": testbed.interface},
            }
        )
    )
    path = f"{Path(sys.executable).parent}:{testbed.env['PATH']}"
    return cluster_json, {**testbed.env, "PATH": path, "PYTHONPATH": str(REPO_ROOT)}


def main(argv: list[str] | None = None) -> int:
    """`up`: run a testbed until Ctrl-C (or SIGTERM); `down PREFIX`: remove a killed one's rest."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.slurm_testbed", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start a SLURM testbed and keep it up until Ctrl-C")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--bandwidth", help='link rate of every node, e.g. "1gbit"')
    up.add_argument("--cpus-per-node", type=int, default=1)
    down = actions.add_parser("down", help="remove what a killed testbed left")
    down.add_argument("prefix", help="the lcXXXXXX prefix that up printed")
    args = parser.parse_args(argv)
    try:
        if args.action == "down":
            removed = remove_testbed(args.prefix)
            print(f"removed: {', '.join(removed) or 'nothing (already gone)'}")
            return 0
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop() runs on the way out
        with SlurmTestbed(
            args.nodes, bandwidth=args.bandwidth, cpus_per_node=args.cpus_per_node
        ) as bed:
            nodes = ", ".join(f"{name} {address}" for name, address in bed.nodes)
            print(f"testbed {bed.layout.prefix} up in {bed.startup_s:.1f} s: {nodes}")
            print(f"export SLURM_CONF={bed.conf_path} GLOO_SOCKET_IFNAME={bed.interface}")
            print("Ctrl-C stops it and removes everything", flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt:
        return 0
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
