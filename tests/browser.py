"""Headless Chromium for the tests of pages (`landcover view`, the evaluation report).

`chromium` (a session fixture) is Debian's /usr/bin/chromium; when it is missing, the fixture
installs the `chromium` package with apt-get on a machine where the tests run as root, and
otherwise skips with the reason on one line. `render` opens a page in a fresh headless browser
and drives it through the DevTools protocol (a websocket, aiohttp's client): it waits until the
page's images are decoded, runs the test's scripts, evaluates the test's expressions, takes a
screenshot, and returns them with every console error, uncaught exception and error log entry
the page raised, and every URL it asked for.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image

CHROMIUM = Path("/usr/bin/chromium")
INSTALL_LOCK = Path(tempfile.gettempdir()) / "landcover-tests-chromium-install.lock"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 120.0  # a loaded machine starts Chromium slowly
RENDER_TIMEOUT_S = 180.0
# Resolves once every <img> of the page is decoded and two frames have been drawn after that.
_IMAGES_DRAWN = """new Promise(function (done) {
  Promise.all(Array.from(document.images).map(function (img) {
    return img.decode().catch(function () {});
  })).then(function () {
    requestAnimationFrame(function () { requestAnimationFrame(function () { done(true); }); });
  });
})"""


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium: installed with apt-get when missing and the tests run as root."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{CHROMIUM} is missing; install Debian's chromium (apt-get needs root)")
    # Test processes (pytest-xdist workers) may get here at once: one installs, the others
    # wait for it and find Chromium in place.
    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CHROMIUM.exists():
            _apt_install_chromium()
    return CHROMIUM


def _apt_install_chromium() -> None:
    """apt-get install chromium, after refreshing the package lists if the first try fails (a
    fresh machine has none); fails the test with apt's last line if it cannot."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends",
               "-o", "DPkg::Lock::Timeout=240", "chromium"]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=900)
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0 or not CHROMIUM.exists():
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.fail(f"apt-get install chromium failed as root: {said}")


@dataclass
class Rendered:
    """What a page did in the browser."""

    values: dict[str, Any]  # the test's expressions, evaluated after its scripts
    screenshot: npt.NDArray[np.uint8]  # (h, w, 3)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def has_colour(self, rgb: Sequence[int], *, at_least: int = 20) -> bool:
        """Whether the screenshot holds at least `at_least` pixels of exactly `rgb`."""
        hits = np.all(self.screenshot == np.asarray(rgb, dtype=np.uint8), axis=-1)
        return int(hits.sum()) >= at_least


def render(
    chromium: Path,
    page: Path,
    *,
    scripts: Sequence[str] = (),
    values: Mapping[str, str] | None = None,
    width: int = 1000,
    height: int = 700,
) -> Rendered:
    """Open `page` in headless Chromium at `width` x `height`, wait for its images, run each
    of `scripts` (a promise is awaited), evaluate `values` (name → expression) and take a
    screenshot (see the module docstring)."""
    # Chromium's helper processes may still write into the profile as the browser exits.
    with tempfile.TemporaryDirectory(
        prefix="landcover-chromium-", ignore_cleanup_errors=True
    ) as profile:
        process = subprocess.Popen(
            [str(chromium), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its helpers end with it
        )
        try:
            endpoint = _devtools_endpoint(Path(profile), process)
            return asyncio.run(
                asyncio.wait_for(
                    _render(endpoint, page, scripts, dict(values or {}), width, height),
                    RENDER_TIMEOUT_S,
                )
            )
        finally:
            _end(process)


def _end(process: subprocess.Popen[bytes]) -> None:
    """End the browser and the helpers it started (its process group)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()


def _devtools_endpoint(profile: Path, process: subprocess.Popen[bytes]) -> str:
    """The browser's DevTools websocket, from the DevToolsActivePort file it writes."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before listening")
        lines = marker.read_text().split() if marker.exists() else []
        if len(lines) >= 2:
            return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
        time.sleep(0.05)
    raise RuntimeError(f"chromium did not listen within {START_TIMEOUT_S:g} s")


class _DevTools:
    """Commands and events of one DevTools connection (flat sessions)."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()

    async def listen(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)
                self.arrived.set()

    async def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        number = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[number] = future
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.socket.send_str(json.dumps(message))
        answer = await future
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def wait_for(self, method: str, *, after: int = 0) -> dict[str, Any]:
        """The first event `method` among the events from number `after` on."""
        while True:
            for event in self.events[after:]:
                if event.get("method") == method:
                    return event
            self.arrived.clear()
            await self.arrived.wait()

    async def evaluate(self, session: str, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate",
            session,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")


async def _render(
    endpoint: str,
    page: Path,
    scripts: Sequence[str],
    values: Mapping[str, str],
    width: int,
    height: int,
) -> Rendered:
    import aiohttp  # an adlfs dependency: installed wherever landcover is

    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(endpoint, max_msg_size=0) as socket,
    ):
        tools = _DevTools(socket)
        listener = asyncio.create_task(tools.listen())
        try:
            target = await tools.call("Target.createTarget", url="about:blank")
            attached = await tools.call(
                "Target.attachToTarget", targetId=target["targetId"], flatten=True
            )
            session = attached["sessionId"]
            for domain in ("Runtime", "Log", "Page", "Network"):
                await tools.call(f"{domain}.enable", session)
            await tools.call(
                "Emulation.setDeviceMetricsOverride",
                session,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            before = len(tools.events)  # about:blank's own load is not the page's
            await tools.call("Page.navigate", session, url=page.resolve().as_uri())
            await tools.wait_for("Page.loadEventFired", after=before)
            await tools.evaluate(session, _IMAGES_DRAWN)
            for script in scripts:
                await tools.evaluate(session, script)
                await tools.evaluate(session, _IMAGES_DRAWN)
            found = {name: await tools.evaluate(session, e) for name, e in values.items()}
            shot = await tools.call("Page.captureScreenshot", session, format="png")
        finally:
            listener.cancel()
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB"))
    return Rendered(
        values=found,
        screenshot=pixels,
        errors=_errors(tools.events),
        requests=[
            e["params"]["request"]["url"]
            for e in tools.events
            if e.get("method") == "Network.requestWillBeSent"
        ],
    )


def _errors(events: Sequence[dict[str, Any]]) -> list[str]:
    """Uncaught exceptions, console.error/assert calls and error log entries, one line each."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            thrown = details.get("exception", {}).get("description", "")
            errors.append(f"uncaught: {details.get('text', '')} {thrown}".strip())
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            said = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            errors.append(f"console.{params['type']}: {said}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            errors.append(f"log: {entry.get('text', '')} {entry.get('url', '')}".strip())
    return errors
