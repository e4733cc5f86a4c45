"""Running the `landcover` command in this process, as the CLI tests do."""

from __future__ import annotations

from click.testing import CliRunner, Result

from landcover.cli.app import main


def invoke(*args: str) -> Result:
    """`landcover ARGS...` through click's test runner."""
    return CliRunner().invoke(main, list(args))
