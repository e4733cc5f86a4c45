"""Fixtures of the cluster tests: a real SLURM cluster of emulated nodes on this machine.

`slurm_testbed` (one per session: starting it takes about a second, and jobs leave nothing
behind) needs root, iproute2 and slurm-wlm, which it installs with apt-get when missing;
otherwise the test is skipped with the reason on one line. `require_emulated_nodes` skips a
test that builds its own network namespaces when it cannot.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.netns import network_unavailable_reason
from cluster.testbed import SlurmTestbed, slurm_testbed_unavailable_reason


@pytest.fixture(scope="session")
def slurm_testbed() -> Iterator[SlurmTestbed]:
    """A running 2-node SLURM cluster: `.env` for clients, `.nodes` [(name, address)],
    `.interface` for GLOO_SOCKET_IFNAME; stopped (daemons, namespaces, bridge) at the end."""
    reason = slurm_testbed_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # daemons that fail to start here are a failure, not a skip: the machine can run them
    with SlurmTestbed(nodes=2) as bed:
        yield bed


@pytest.fixture
def require_emulated_nodes() -> None:
    """Skip (one line) where network namespaces cannot be built: not root, no iproute2."""
    reason = network_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
