"""The SLURM testbed: real slurmctld and slurmd daemons, each node in a network namespace of
its own. Needs root, iproute2 and slurm-wlm (installed by the fixture when missing); skipped with
the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped,unused-ignore]
import pytest

from cluster.local.netns import NODE_INTERFACE, existing_names
from tests.support.slurm_testbed import SlurmTestbed, slurm_testbed_unavailable_reason


def test_a_two_node_job_runs_one_task_per_node_each_at_its_own_address(
    slurm_testbed: SlurmTestbed,
) -> None:
    bed = slurm_testbed
    assert [name for name, _ in bed.nodes] == ["n0", "n1"]
    task = f"echo $SLURMD_NODENAME $(ip -4 -o addr show {NODE_INTERFACE} | awk '{{print $4}}')"
    started = time.monotonic()
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", task],
        env={**os.environ, **bed.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(f"testbed up in {bed.startup_s:.1f} s; srun -N2 took {time.monotonic() - started:.2f} s")
    assert proc.returncode == 0, proc.stderr
    seen = sorted(tuple(line.split()) for line in proc.stdout.splitlines())
    assert seen == [(name, f"{address}/24") for name, address in bed.nodes]
    assert bed.nodes[0][1] != bed.nodes[1][1]


def test_the_nodes_report_their_namespace_address_to_the_controller(
    slurm_testbed: SlurmTestbed,
) -> None:
    for name, address in slurm_testbed.nodes:
        shown = subprocess.run(
            ["scontrol", "show", "node", name],
            env={**os.environ, **slurm_testbed.env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"NodeAddr={address} " in shown and "State=IDLE" in shown and "CPUTot=1 " in shown


def test_stopping_leaves_no_daemon_namespace_link_or_directory() -> None:
    reason = slurm_testbed_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with SlurmTestbed(nodes=1) as bed:
        prefix = bed.layout.prefix
        pids = bed.daemon_pids()
        conf_dir = Path(bed.conf_path).parent
        assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
        assert existing_names(prefix)
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    assert alive == []  # reaped, not zombies
    assert existing_names(prefix) == []
    assert not conf_dir.exists()
