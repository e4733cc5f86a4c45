"""Fixtures shared by every test package: the real NAIP files, the Azurite blob emulator
(`azurite`, tests/azurite.py), a real SLURM cluster of emulated nodes on this machine
(`slurm_testbed`: one per session, about a second to start; it needs root, iproute2 and
slurm-wlm, which it installs with apt-get when missing, and otherwise the test is skipped with
the reason on one line), and headless Chromium (`chromium`, tests/browser.py).

Every test that needs a service (Azurite, Chromium, SLURM daemons, network namespaces, a Dask
cluster) is marked `service` here, from the fixtures it asks for, so `make test-fast`
(`-m "not slow and not service"`) leaves it out without a list kept by hand.

Under pytest-xdist each worker's torch gets its share of the cores, and the files that hold
slow tests come first, so that `make test` never starts a long file last."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cluster.local.netns import network_unavailable_reason
from tests.azurite import azurite  # noqa: F401  (the session fixture, registered once, here)
from tests.browser import chromium  # noqa: F401  (the session fixture, registered once, here)
from tests.landcover.cli.readers import Scene, write_scene
from tests.support.exportmemo import ExportMemo
from tests.support.paths import REAL_NAIP_DIR, REPO_ROOT  # noqa: F401  (tests import them from here)
from tests.support.slurm_testbed import SlurmTestbed, slurm_testbed_unavailable_reason
from tiling.runtime.machine import cores_per_rank

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


def xdist_worker_threads() -> int | None:
    """This pytest-xdist worker's share of the cores (None outside xdist): the workers run side
    by side, and torch's OpenMP threads, one per core in every process by default, spin
    against each other's when both workers compute."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    return None if workers is None else cores_per_rank(int(workers))


def pytest_configure(config: pytest.Config) -> None:
    """Processes a worker's tests start (the CLI, notebook kernels) inherit its share of the
    cores; the engines and the trainer still set their ranks' threads themselves."""
    threads = xdist_worker_threads()
    if threads is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    config.pluginmanager.register(HeaviestFilesFirst(), "heaviest-files-first")


# Rough cost of a test by its marks, to order the files (not a measurement of any test)
SLOW_WEIGHT, SERVICE_WEIGHT, OTHER_WEIGHT = 10.0, 3.0, 0.2


def file_weight(items: list[pytest.Item]) -> float:
    return sum(
        SLOW_WEIGHT
        if item.get_closest_marker("slow")
        else SERVICE_WEIGHT
        if item.get_closest_marker("service")
        else OTHER_WEIGHT
        for item in items
    )


class HeaviestFilesFirst:
    """Runs the files that hold slow or service tests first, each file's tests kept together
    and in their order. `make test` hands files to its two workers in this order
    (`--dist loadfile --no-loadscope-reorder`): a long file handed out last would keep one
    worker busy while the other has nothing left, and xdist's own order (most tests first)
    puts the long files, which hold few tests, last."""

    @pytest.hookimpl(trylast=True)  # after -m and -k have deselected
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        files: dict[str, list[pytest.Item]] = {}
        for item in items:
            files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
        ordered = sorted(files.values(), key=file_weight, reverse=True)  # stable: ties keep order
        items[:] = [item for file_items in ordered for item in file_items]


@pytest.fixture(autouse=True)
def share_of_the_cores() -> None:
    """Each test starts with this worker's share of torch's threads: a test that trains in this
    process (the trainer takes every core of a one-rank run) leaves no more to the next."""
    threads = xdist_worker_threads()
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `service` every test that needs a service (SERVICE_FIXTURES, the `azurite` marker,
    a Dask cluster of a module that imports `distributed`)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        module = getattr(item, "module", None)
        dask = module is not None and "distributed" in vars(module) and names & DASK_FIXTURES
        if names & SERVICE_FIXTURES or item.get_closest_marker("azurite") or dask:
            item.add_marker(pytest.mark.service)


@pytest.fixture(scope="session", autouse=True)
def export_memo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExportMemo]:
    """ONNX exports made once per distinct model file in the session (tests/support/
    exportmemo.py), in a directory the xdist workers of this run share."""
    import landcover.models.export as export

    base = tmp_path_factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"onnx-exports-{run}" if run else base / "onnx-exports"
    memo = ExportMemo(root, export._write_onnx, torch.onnx.export)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, "_write_onnx", memo)
        yield memo


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
