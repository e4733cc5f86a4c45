"""Fixtures shared by every test package: the real NAIP files, the Azurite blob emulator
(`azurite`, tests/azurite.py), a real SLURM cluster of emulated nodes on this machine
(`slurm_testbed`: one per session, about a second to start; it needs root, iproute2 and
slurm-wlm, which it installs with apt-get when missing, and otherwise the test is skipped with
the reason on one line), and headless Chromium (`chromium`, tests/browser.py).

Every test that needs a service (Azurite, Chromium, SLURM daemons, network namespaces, a Dask
cluster) is marked `service` here, from the fixtures it asks for, so `make test-fast`
(`-m "not slow and not service"`) leaves it out without a list kept by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local.netns import network_unavailable_reason
from tests.azurite import azurite  # noqa: F401  (the session fixture, registered once, here)
from tests.browser import chromium  # noqa: F401  (the session fixture, registered once, here)
from tests.landcover.cli.readers import Scene, write_scene
from tests.support.paths import REAL_NAIP_DIR, REPO_ROOT  # noqa: F401  (tests import them from here)
from tests.support.slurm_testbed import SlurmTestbed, slurm_testbed_unavailable_reason

HEADER_PACKAGES = ("torch", "torchvision", "numpy", "rasterio", "zarr")
# Fixtures that start or need a service: a test asking for one (directly or through another
# fixture) is marked `service`.
SERVICE_FIXTURES = frozenset(
    {"azurite", "chromium", "slurm_testbed", "require_emulated_nodes", "local_cluster"}
)
# In a module that starts Dask (imports `distributed`), these fixtures are a running cluster.
DASK_FIXTURES = frozenset({"client", "nodes"})


def pytest_sessionstart(session: pytest.Session) -> None:
    """The versions that decide the suite's numbers, first in its output at any verbosity
    (GDAL's is rasterio's own build)."""
    from importlib.metadata import PackageNotFoundError, version

    import rasterio

    found = []
    for name in HEADER_PACKAGES:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    found.insert(HEADER_PACKAGES.index("rasterio") + 1, f"GDAL {rasterio.__gdal_version__}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("versions: " + ", ".join(found))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `service` every test that needs a service (SERVICE_FIXTURES, the `azurite` marker,
    a Dask cluster of a module that imports `distributed`)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = getattr(item, "module", None)
        dask = module is not None and "distributed" in vars(module) and names & DASK_FIXTURES
        if names & SERVICE_FIXTURES or item.get_closest_marker("azurite") or dask:
            item.add_marker(pytest.mark.service)


@pytest.fixture(scope="session")
def real_naip_dir() -> Path:
    """The six real NAIP GeoTIFFs in tests/data/naip-real (0.6 m, NIR tagged as alpha, ...)."""
    if not REAL_NAIP_DIR.is_dir():
        pytest.fail(f"real NAIP test data missing at {REAL_NAIP_DIR}; restore tests/data from git")
    return REAL_NAIP_DIR


@pytest.fixture(scope="session")
def real_naip_paths(real_naip_dir: Path) -> list[Path]:
    return sorted(real_naip_dir.glob("*.tif"))


@pytest.fixture(scope="module")
def reader_scene(tmp_path_factory: pytest.TempPathFactory) -> Scene:
    """An image with its truth, a model file and a prediction: the inputs of every command
    that reads inputs (tests/landcover/cli/readers.py). Once per module, so the links and
    copies a module makes beside it are its own."""
    return write_scene(tmp_path_factory.mktemp("reader-scene"))


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
