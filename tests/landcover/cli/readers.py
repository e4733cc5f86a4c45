"""The commands that read input rasters (`tile`, `predict`, `evaluate`), each written as a
command line of its inputs, over one tiny scene: a 4-band image, a model, a prediction map and
a truth raster of the same 90 x 75 m place. Shared by the tests of what every such command
takes (STAC documents, one file under two names, HTTP URLs)."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner, Result

from landcover.cli.app import main
from landcover.prediction.outgrid import TAG_CLASS_MAP
from tests.landcover.evaluation.maps import write
from tests.landcover.prediction.inputs import CLASS_MAP, ORIGIN, UTM18, pixels, write_image
from tests.landcover.prediction.inputs import write_model as write_model_file

READERS = ("tile", "predict", "evaluate")
HEIGHT, WIDTH = 75, 90  # px of 1 m, not multiples of the 32 px chip


@dataclass(frozen=True, slots=True)
class Scene:
    """The files of the scene; `raster(command)` is the kind of input `command` reads."""

    image: Path
    truth: Path
    model: Path
    prediction: Path

    def raster(self, command: str) -> Path:
        return self.truth if command == "evaluate" else self.image

    def args(self, command: str, inputs: Sequence[str], out: Path, *extra: str) -> list[str]:
        """`command` reading `inputs` (images, or evaluate's truth), writing under `out`."""
        if command == "tile":
            return ["tile", *inputs, "--out", str(out / "chips.zarr"), "--chip-size", "32",
                    "--workers", "1", *extra]  # fmt: skip
        if command == "predict":
            return ["predict", str(self.model), *inputs, "--out", str(out / "lc.tif"),
                    "--device", "cpu", *extra]  # fmt: skip
        truth = [arg for path in inputs for arg in ("--truth", path)]
        return ["evaluate", str(self.prediction), *truth, "--json", *extra]


def write_scene(root: Path) -> Scene:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    codes = rng.integers(1, 5, size=(HEIGHT, WIDTH), dtype=np.uint8)
    tags = {TAG_CLASS_MAP: json.dumps(CLASS_MAP.to_json())}
    x0, y0 = ORIGIN
    return Scene(
        image=write_image(root / "scene.tif", pixels(HEIGHT, WIDTH, seed=1)),
        truth=write(root / "truth.tif", codes, x0=x0, y0=y0, crs=UTM18),
        model=write_model_file(root / "model.pt", constant_class=2),
        prediction=write(root / "pred.tif", codes, x0=x0, y0=y0, crs=UTM18, nodata=0, tags=tags),
    )


@contextmanager
def http_files(root: Path) -> Iterator[str]:
    """`root` served over HTTP from 127.0.0.1 (404 for what is not there); yields the base URL
    (without a trailing slash). Stopped on exit."""
    handler = functools.partial(_QuietFileHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _QuietFileHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def run(args: Sequence[str]) -> Result:
    return CliRunner().invoke(main, list(args))


def one_error_line(result: Result) -> str:
    """The error line of a command that refused its input: exit 2, one line, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def inputs_read(command: str, result: Result) -> int:
    """How many inputs the command says it read."""
    assert result.exit_code == 0, result.output
    if command == "tile":
        return int(result.stdout.split(" sources in ")[0].rsplit("from ", 1)[1])
    if command == "predict":
        return int(result.stdout.split(" image(s)")[0].rsplit("from ", 1)[1])
    return len(json.loads(result.stdout)["truth"])
