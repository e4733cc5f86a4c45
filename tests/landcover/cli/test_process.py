"""The `landcover` process as a shell sees it: SIGTERM, a closed pipe, library warnings.

Each test runs the real entry point in a subprocess with a few extra commands (defined
below) registered in `landcover.cli.app.COMMANDS`, so what is tested is main's own handling,
for every command alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import click
import numpy as np
import pytest

from landcover.cli.app import EXIT_BROKEN_PIPE, EXIT_SIGTERM
from landcover.outputs import write_atomic
from tests.conftest import REPO_ROOT


@click.command()
def spew() -> None:
    """Print until the reader goes away."""
    while True:
        click.echo("x" * 80)


@click.command()
@click.argument("target")
def slow_write(target: str) -> None:
    """An atomic write that is half done when the test sends SIGTERM."""

    def write(tmp: str) -> None:
        Path(tmp).write_text("half")
        click.echo("ready")
        time.sleep(60)

    write_atomic(target, write)


@click.command()
@click.argument("tif")
def warn(tif: str) -> None:
    """One warning of our own over two lines, one of rasterio."""
    import rasterio

    warnings.warn("first line\nsecond line", UserWarning, stacklevel=1)
    with rasterio.open(tif):  # no geotransform: NotGeoreferencedWarning
        pass


def landcover(*args: str, **popen: object) -> subprocess.Popen[str]:
    """`landcover ARGS` with the commands above registered."""
    code = (
        "from landcover.cli import app as cli; "
        "cli.COMMANDS.update({n: 'tests.landcover.cli.test_process:' + n "
        "for n in ('spew', 'slow_write', 'warn')}); "
        "cli.main(prog_name='landcover')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,  # type: ignore[call-overload]
    )


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly() -> None:
    proc = landcover("spew")  # as `landcover spew | head -1`
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == "x" * 80 + "\n"
    proc.stdout.close()
    assert proc.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert proc.stderr.read() == ""


def test_sigterm_cleans_up_and_exits_143_with_one_line(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    proc = landcover("slow_write", str(target))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    temps = list(tmp_path.iterdir())
    assert len(temps) == 1 and temps[0].name.startswith(".model.pt.")  # half written
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_SIGTERM == 143
    assert stderr == "error: terminated (SIGTERM)\n"
    assert list(tmp_path.iterdir()) == []  # the temp file is gone, no target was made


@pytest.mark.parametrize("verbose", [False, True])
def test_library_warnings_are_one_log_line_each(tmp_path: Path, verbose: bool) -> None:
    import rasterio

    tif = tmp_path / "plain.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rasterio.open(
            tif, "w", driver="GTiff", width=4, height=4, count=1, dtype="uint8"
        ) as dst:
            dst.write(np.zeros((1, 4, 4), dtype=np.uint8))
    proc = landcover(*(["-v"] if verbose else []), "warn", str(tif))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    lines = stderr.splitlines()
    assert len(lines) == 2, stderr
    ours, theirs = lines
    assert ours.startswith("WARNING py.warnings: UserWarning: first line")
    assert theirs.startswith("WARNING py.warnings: NotGeoreferencedWarning: Dataset has no")
    assert ("test_process.py:" in ours) is verbose
