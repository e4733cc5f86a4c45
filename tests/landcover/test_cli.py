"""The CLI shell: lazy subcommands, one-line errors, exit codes."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from landcover import cli
from landcover.errors import LandcoverError


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
    code = "import sys; from landcover.cli import main; print('torch' in sys.modules)"
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

    monkeypatch.setitem(cli.COMMANDS, "boom", "tests.landcover.test_cli:_BOOM")
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
