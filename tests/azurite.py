"""Azurite, the Azure Blob Storage emulator, for tests of az:// stores.

`azurite_server()` finds the binary (env LANDCOVER_AZURITE, else .tools/node_modules/.bin under
the repo, else installs it with npm into .tools), starts the blob service on a free localhost
port with its data in a temporary folder, waits until it answers, creates a container and
yields adlfs storage options for it. Missing node/npm is a test failure with the fix, never a
skip: the az:// path is part of the product. The session fixture `azurite` is defined here
once; the conftests of the test packages that need it import it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.multiprocess import free_port
from tests.support.paths import REPO_ROOT

TOOLS_DIR = REPO_ROOT / ".tools"
ACCOUNT = "devstoreaccount1"
# The well-known development key every Azurite instance accepts (not a secret).
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START_TIMEOUT_S = 60.0
INSTALL_TIMEOUT_S = 600.0


class AzuriteUnavailableError(RuntimeError):
    """Azurite could not be found, installed or started."""


@dataclass(frozen=True)
class Azurite:
    """A running emulator: its port, a fresh container and adlfs options for it."""

    port: int
    container: str

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT};"
        )

    @property
    def storage_options(self) -> dict[str, str]:
        return {"connection_string": self.connection_string}

    def url(self, path: str) -> str:
        return f"az://{self.container}/{path}"


def _blob_binary(azurite: Path) -> Path:
    """The blob-only service next to the `azurite` launcher (no queue/table ports)."""
    blob = azurite.with_name("azurite-blob")
    return blob if blob.exists() else azurite


def find_or_install_azurite() -> Path:
    env = os.environ.get("LANDCOVER_AZURITE")
    if env:
        path = Path(env)
        if not path.exists():
            raise AzuriteUnavailableError(
                f"LANDCOVER_AZURITE={env} does not exist; run `make test`"
            )
        return _blob_binary(path)
    local = TOOLS_DIR / "node_modules" / ".bin" / "azurite"
    if local.exists():
        return _blob_binary(local)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise AzuriteUnavailableError(
            "Azurite is needed for the az:// store tests and node/npm are missing; install "
            "Node.js (e.g. apt-get install nodejs npm), then run `make test`"
        )
    TOOLS_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            npm,
            "install",
            "--silent",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(TOOLS_DIR),
            "azurite@3",
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0 or not local.exists():
        raise AzuriteUnavailableError(
            f"`npm install --prefix {TOOLS_DIR} azurite@3` failed: {done.stderr.strip()[:300]}"
        )
    return _blob_binary(local)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AzuriteUnavailableError(f"azurite exited with {process.returncode}: {out[:300]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AzuriteUnavailableError(f"azurite did not answer on port {port} within {timeout_s:.0f} s")


@contextlib.contextmanager
def azurite_server() -> Iterator[Azurite]:
    """Start Azurite, create a container, yield it; stop Azurite afterwards."""
    binary = find_or_install_azurite()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="azurite-") as location:
        process = subprocess.Popen(
            [
                str(binary),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--location",
                location,
                "--silent",
                "--disableTelemetry",
                "--skipApiVersionCheck",
                "--loose",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_port(port, process, START_TIMEOUT_S)
            server = Azurite(port=port, container=f"test-{uuid.uuid4().hex[:12]}")
            from azure.storage.blob import BlobServiceClient

            client = BlobServiceClient.from_connection_string(server.connection_string)
            client.create_container(server.container)
            client.close()
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """A running Azurite with a fresh container (installed with npm if needed)."""
    try:
        with azurite_server() as server:
            yield server
    except AzuriteUnavailableError as exc:
        pytest.fail(str(exc))
