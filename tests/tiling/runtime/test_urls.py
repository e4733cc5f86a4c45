"""A URL that is not there (HTTP 404) or whose host does not answer is said so, in one line, by
every command that reads inputs: never "not a readable GeoTIFF ... re-download it"."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.landcover.cli.readers import READERS, Scene, http_files, one_error_line, run
from tiling.errors import SourceNotFoundError, StorageAccessError
from tiling.runtime.urls import remote_failure


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("name", ["missing.tif", "missing.json"])
def test_a_missing_url_is_not_found_http_404(
    reader_scene: Scene, tmp_path: Path, command: str, name: str
) -> None:
    with http_files(reader_scene.image.parent) as base:
        url = f"{base}/{name}"
        line = one_error_line(run(reader_scene.args(command, [url], tmp_path / "out")))
    assert line.startswith(f"error: {url}: not found (HTTP 404); check the URL")
    assert not list(tmp_path.rglob("*.*"))  # no store, map or report begun


@pytest.mark.parametrize("command", READERS)
@pytest.mark.parametrize("name", ["scene.tif", "items.json"])
def test_a_host_that_does_not_answer_is_cannot_connect(
    reader_scene: Scene, tmp_path: Path, command: str, name: str
) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/{name}"
    line = one_error_line(run(reader_scene.args(command, [url], tmp_path / "out")))
    assert line == (
        f"error: {url}: cannot connect to 127.0.0.1:{port} (Connection refused); check the URL "
        "and the network"
    )


def test_evaluate_says_so_of_its_prediction_too(reader_scene: Scene) -> None:
    with http_files(reader_scene.prediction.parent) as base:
        url = f"{base}/missing-map.tif"
        line = one_error_line(run(["evaluate", url, "--truth", str(reader_scene.truth)]))
    assert line == f"error: {url}: not found (HTTP 404); check the URL"


@pytest.mark.parametrize("command", ["tile", "predict"])
def test_a_stac_api_that_does_not_answer_is_cannot_connect(
    reader_scene: Scene, tmp_path: Path, command: str
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/"
    area = ["--bbox", "-75.1,36,-74.9,36.2"] + (
        ["--region-crs", "EPSG:4326"] * (command == "predict")
    )
    args = reader_scene.args(
        command, [], tmp_path / "out", "--stac-api", url, "--collection", "naip", *area
    )
    line = one_error_line(run(args))
    assert line.startswith(f"error: --stac-api {url}: search failed: cannot connect to 127.0.0.1:")


class StatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.status = status


@pytest.mark.parametrize(
    ("exc", "kind", "message"),
    [
        (FileNotFoundError("u"), SourceNotFoundError, "u: not found; check the URL"),
        (StatusError(404), SourceNotFoundError, "u: not found (HTTP 404); check the URL"),
        (StatusError(403), StorageAccessError, "u: access denied (HTTP 403)"),
        (StatusError(503), StorageAccessError, "u: server error (HTTP 503); check the URL, or try"),
        (ValueError("corrupt"), type(None), ""),
    ],
)
def test_remote_failures_are_read_from_the_exception_chain(
    exc: Exception, kind: type, message: str
) -> None:
    try:
        try:
            raise exc
        except Exception as inner:
            raise OSError("wrapped") from inner
    except OSError as outer:
        error = remote_failure("u", outer)
    assert isinstance(error, kind)
    assert str(error).startswith(message)
