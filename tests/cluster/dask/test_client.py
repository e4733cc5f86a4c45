"""The Dask client side: an error raised in a task reaches the caller as itself, a scheduler
address is checked when cluster.json is read and a closed port is said at once, a closed
client is one line, and the embedded LocalCluster starts no dashboard and no more workers
than this machine has cores."""

from __future__ import annotations

import errno
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import distributed
import pytest
from rasterio._err import CPLE_AppDefinedError

from cluster.clusterjson import parse_cluster_spec
from cluster.dask.client import TaskRunner, check_open, dask_client
from cluster.dask.engine import plan_dask
from cluster.dask.remote import RemoteTaskError, TaskFailure, run_capturing
from cluster.dask.section import DaskSpec
from cluster.engine import Job
from cluster.errors import ClusterSpecError, LaunchError
from tiling.errors import SourceFormatError
from tiling.runtime.machine import local_cpu_count


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two workers in this process (threads), over TCP as a real cluster's."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as connected,
    ):  # fmt: skip
        yield connected


def read_corrupt(path: str) -> None:
    """Fail as a corrupt source does: our error, raised while a GDAL error (which does not
    pickle with its chain) is being handled."""
    try:
        raise CPLE_AppDefinedError(1, 1, "ZIPDecode:Decoding error")
    except CPLE_AppDefinedError as exc:
        raise SourceFormatError(f"{path}: cannot read pixels ({exc})") from exc


def disk_full(path: str) -> None:
    raise OSError(errno.ENOSPC, "No space left on device", path)


class UnpicklableError(Exception):
    def __init__(self, message: str, *, handle: Any) -> None:
        super().__init__(message)
        self.handle = handle


def unpicklable(path: str) -> None:
    raise UnpicklableError(f"{path}: held", handle=lambda: None)


def test_a_tasks_error_is_raised_here_as_it_was_raised_there(client: Any) -> None:
    """Before: the GDAL cause made Dask send `Exception("SourceFormatError('...')")`, which
    the CLI called an internal error, after retrying the unit twice."""
    runner = TaskRunner(client, show_progress=False)
    with pytest.raises(SourceFormatError) as raised:
        runner(read_corrupt, ["a.tif"], what="sources")
    assert str(raised.value) == "a.tif: cannot read pixels (ZIPDecode:Decoding error)"
    assert "ZIPDecode" in str(raised.value.__cause__)  # the cause travels where it can
    assert any("read_corrupt" in note for note in raised.value.__notes__)  # for -v
    with pytest.raises(OSError) as full:
        runner(disk_full, ["out/x.tif"], what="tiles")
    assert full.value.errno == errno.ENOSPC and full.value.filename == "out/x.tif"
    with pytest.raises(RemoteTaskError) as held:
        runner(unpicklable, ["b.tif"], what="tiles")
    assert str(held.value) == "UnpicklableError: b.tif: held"


def test_a_failure_is_a_value_in_the_task_and_an_exception_here() -> None:
    failure = run_capturing(read_corrupt, "c.tif")
    assert isinstance(failure, TaskFailure) and failure.where == "this process"
    error = failure.exception()
    assert isinstance(error, SourceFormatError) and error.__cause__ is not None
    assert run_capturing(len, "abc") == 3


def test_a_closed_client_is_one_line() -> None:
    with (
        distributed.LocalCluster(
            n_workers=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as closed,
    ):  # fmt: skip
        pass
    with pytest.raises(LaunchError, match=r"the distributed\.Client given is closed: pass an open"):
        check_open(closed)
    with pytest.raises(LaunchError, match="is closed"), dask_client(client=closed):
        pass


@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("tcp://10.0.0.4:99999", "port 99999 is not a TCP port (1-65535)"),
        ("tcp://999.1.1.1:8786", "'999.1.1.1' is not an IPv4 address"),
        ("tcp://10.0.0:8786", "'10.0.0' is not an IPv4 address"),
        ("tcp://-bad-:8786", "'-bad-' is not a host name"),
        ("10.0.0.4", "must be a scheduler address"),
    ],
)
def test_a_scheduler_address_is_checked_when_cluster_json_is_read(address: str, said: str) -> None:
    with pytest.raises(ClusterSpecError, match=re.escape(f"dask.scheduler: {said}")):
        parse_cluster_spec({"engine": "dask", "targetNodeCount": 1, "dask": {"scheduler": address}})


@pytest.mark.parametrize("address", ["tcp://10.0.0.4:8786", "tls://sched.example:1", "node-1:8786"])
def test_good_scheduler_addresses_pass(address: str) -> None:
    spec = parse_cluster_spec(
        {"engine": "dask", "targetNodeCount": 1, "dask": {"scheduler": address}}
    )
    dask = spec.section_of(DaskSpec)
    assert dask is not None and dask.scheduler == address


def test_a_closed_port_is_connection_refused_at_once() -> None:
    """Before: the client retried for connectTimeout, then said only that it timed out."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = parse_cluster_spec(
        {"engine": "dask", "targetNodeCount": 1,
         "dask": {"scheduler": f"tcp://127.0.0.1:{port}", "connectTimeout": "1h"}}
    )  # fmt: skip
    with pytest.raises(LaunchError, match="connection refused") as refused, dask_client(spec):
        pass
    assert str(refused.value).startswith(
        f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"
    )


def test_the_embedded_cluster_has_a_worker_per_core_at_most() -> None:
    """Before: targetNodeCount x processesPerNode worker processes, however many (500)."""
    cores = local_cpu_count()
    embedded = DaskSpec()
    assert embedded.local_workers(cores, ranks=True) == cores
    assert embedded.local_workers(cores * 250, ranks=False) == cores
    assert f"{cores} worker processes" in embedded.describe(cores * 250)
    with pytest.raises(ClusterSpecError, match=f"{cores * 250} ranks, one worker each"):
        embedded.local_workers(cores * 250, ranks=True)
    remote = DaskSpec(scheduler="tcp://10.0.0.4:8786")
    assert "the Dask cluster at tcp://10.0.0.4:8786" in remote.describe(500)


def test_the_embedded_cluster_starts_no_dashboard() -> None:
    """Before: dashboard_address=None still served the dashboard on 0.0.0.0:8787."""
    spec = parse_cluster_spec({"engine": "dask", "targetNodeCount": 1})
    with dask_client(spec) as client:
        server = client.cluster.scheduler.http_server
        assert server.address == "127.0.0.1"  # what distributed still serves: loopback only
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(client.dashboard_link, timeout=30)
    assert missing.value.code == 404


def test_more_ranks_than_cores_on_the_embedded_cluster_are_refused_when_planned() -> None:
    cores = local_cpu_count()
    spec = parse_cluster_spec(
        {"engine": "dask", "targetNodeCount": 250, "processesPerNode": 2 * cores}
    )
    job = Job("landcover.training", ("store", "--out", "run"), process_group=True)
    with pytest.raises(ClusterSpecError, match=f"= {500 * cores} ranks, one worker each"):
        plan_dask(spec, job)
