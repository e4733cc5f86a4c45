"""The one error line (`landcover.cli.app`, issue 41): storage options that came from
$LANDCOVER_STORAGE_OPTIONS are named as such when they are the cause, since a user who never
typed --storage-options would not look for them in the environment; and a library check
reached from the command line names the command's flag, not a Python field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stageruns import run

ACCOUNT = '{"account_name": "x"}'


def test_storage_options_from_the_environment_are_named(images: Path, tmp_path: Path) -> None:
    args = ["tile", str(images / "a.tif"), "--out", str(tmp_path / "s.zarr")]
    typed = run(*args, "--storage-options", ACCOUNT)
    from_env = run(*args, env={"LANDCOVER_STORAGE_OPTIONS": ACCOUNT})
    assert typed.exit_code == from_env.exit_code == 2
    typed_line = typed.output.strip().splitlines()[-1]
    env_line = from_env.output.strip().splitlines()[-1]
    assert typed_line.startswith("error: --storage-options (account_name) do not apply")
    assert "LANDCOVER_STORAGE_OPTIONS" not in typed_line
    assert env_line == (
        f"{typed_line} (--storage-options came from $LANDCOVER_STORAGE_OPTIONS in the "
        "environment: fix or unset it there)"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--size", "10"], "error: --size 10: choose a scene size of 64..16384 pixels"),
        (["--seed", "-1"], "error: --seed -1: the seed must be a non-negative integer"),
    ],
)
def test_synth_names_its_flags_not_python_fields(
    tmp_path: Path, args: list[str], line: str
) -> None:
    """Before: `landcover synth --size 10` said "size_px=10"."""
    result = run("synth", str(tmp_path / "out"), *args)
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == line
