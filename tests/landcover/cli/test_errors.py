"""The one error mapping (`landcover.cli.app`): storage options that came from
$LANDCOVER_STORAGE_OPTIONS are named as such when they are the cause (issue 41), since a user
who never typed --storage-options would not look for them in the environment."""

from __future__ import annotations

from pathlib import Path

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
