"""The CLI shell: lazy subcommands, one-line errors, exit codes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest
import rasterio.errors
from click.testing import CliRunner

from landcover.cli import app as cli
from landcover.errors import LandcoverError
from tests.support.chipstores import incomplete_copy, incomplete_store_error


def test_help_lists_every_stage() -> None:
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    for name in ("synth", "tile", "info", "train", "cluster", "scale", "report", "predict"):
        assert name in result.output


def test_every_registered_command_imports() -> None:
    ctx = click.Context(cli.main)
    for name in cli.COMMANDS:
        assert isinstance(cli.main.get_command(ctx, name), click.Command), name


def test_help_does_not_import_torch() -> None:
    code = "import sys; from landcover.cli.app import main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture
def failing_command(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    @click.option("--kind", default="user")
    def boom(kind: str) -> None:
        if kind == "user":
            raise LandcoverError("thing.tif: expected 4 bands, found 3\nsecond line")
        raise RuntimeError("unexpected")

    monkeypatch.setitem(cli.COMMANDS, "boom", "tests.landcover.cli.test_main:_BOOM")
    globals()["_BOOM"] = boom


@pytest.mark.usefixtures("failing_command")
def test_user_error_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(cli.main, ["boom"])
    assert result.exit_code == 2
    assert result.output == "error: thing.tif: expected 4 bands, found 3\n"


@pytest.mark.usefixtures("failing_command")
def test_internal_error_is_one_line_exit_3_unless_verbose() -> None:
    result = CliRunner().invoke(cli.main, ["boom", "--kind", "bug"])
    assert result.exit_code == 3
    assert result.output.startswith("error: internal error: RuntimeError: unexpected")
    assert "Traceback" not in result.output
    verbose = CliRunner().invoke(cli.main, ["-v", "boom", "--kind", "bug"])
    assert isinstance(verbose.exception, RuntimeError)


def test_train_refuses_an_incomplete_store_unless_allowed(tiny_store: str, tmp_path: Path) -> None:
    url = incomplete_copy(tiny_store, tmp_path / "interrupted.zarr")
    args = ["train", url, "--out", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "8",
            "--threads", "1", "--device", "cpu"]  # fmt: skip
    refused = CliRunner().invoke(cli.main, args)
    assert refused.exit_code == 2
    assert refused.stderr == incomplete_store_error(url)
    allowed = CliRunner().invoke(cli.main, [*args, "--allow-incomplete"])
    assert allowed.exit_code == 0, allowed.output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["config"]["allow_incomplete"] is True


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (sqlite3.OperationalError("database or disk is full"), "the disk is full"),
        (
            rasterio.errors.RasterioIOError("out/lc.tif: No space left on device"),
            "the disk is full (out/lc.tif: No space left on device)",
        ),
        (
            sqlite3.OperationalError("attempt to write a readonly database"),
            "the output is on a read-only file system",
        ),
    ],
)
def test_a_full_or_read_only_disk_said_by_another_library_is_one_line(
    monkeypatch: pytest.MonkeyPatch, error: Exception, said: str
) -> None:
    """SQLite (tune's study) and GDAL (predict's COG blocks) word a full disk their own way,
    sometimes wrapped in another error: still one line, exit 2, no traceback."""

    @click.command()
    def full() -> None:
        try:
            raise error
        except Exception as inner:
            raise RuntimeError("while writing") from inner

    monkeypatch.setitem(cli.COMMANDS, "full", "tests.landcover.cli.test_main:_FULL")
    monkeypatch.setitem(globals(), "_FULL", full)
    result = CliRunner().invoke(cli.main, ["full"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {said}") and result.output.count("\n") == 1
