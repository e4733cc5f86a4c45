"""The one error line (`landcover.cli.app`, issue 41): storage options that came from
$LANDCOVER_STORAGE_OPTIONS are named as such when they are the cause, since a user who never
typed --storage-options would not look for them in the environment; and a library check
reached from the command line names the command's flag, not a Python field. A user's value in
the line (or in a log line) is text: a line break, escape sequence or bidirectional override in
a file name is shown escaped, so it can neither forge a line nor act on the terminal."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from landcover.cli.app import TerminalFormatter
from landcover.markup import terminal_text
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


# --- user values in the one line: text, never terminal control ---------------------------------

TERMINAL_NAMES = (
    "new\nerror: all fine",  # would start a forged line, or cut the message at "new"
    "clear\x1b[2J\x1b[31mred",  # would clear the screen and colour what follows
    "back\rerror: over",  # would overwrite the start of the line
    "rtl\u202egpj.tif",  # would show the rest of the line reversed
    "zero\u200bwidth\u2028sep",
)


def _missing(tmp_path: Path, name: str, suffix: str) -> str:
    return str(tmp_path / f"{name}{suffix}")


COMMANDS = {
    "info": lambda t, n: ["info", _missing(t, n, ".zarr")],
    "train": lambda t, n: ["train", _missing(t, n, ".zarr"), "--out", str(t / "run")],
    "predict": lambda t, n: ["predict", str(t / "m.pt"), _missing(t, n, ".tif"), "--out",
                            str(t / "o.tif")],
    "view": lambda t, n: ["view", _missing(t, n, ".tif"), "--out", str(t / "p.html")],
    "evaluate": lambda t, n: ["evaluate", _missing(t, n, ".tif"), "--truth", str(t / "x.tif")],
    "change": lambda t, n: ["change", _missing(t, n, ".tif"), _missing(t, n, ".tif"), "--out",
                           str(t / "c")],
}  # fmt: skip


@pytest.mark.parametrize("name", TERMINAL_NAMES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_name_in_the_error_line_is_shown_escaped_whole(
    tmp_path: Path, command: str, name: str
) -> None:
    """Before, a file name's line break cut the message at the break (naming another file),
    and its escape sequences or bidirectional overrides reached the terminal as they were."""
    result = run(*COMMANDS[command](tmp_path, name))
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.output
    line = errors[0]
    assert terminal_text(name) in line, line
    assert line.isprintable() and line == terminal_text(line), line


@pytest.mark.parametrize("name", TERMINAL_NAMES)
def test_log_lines_escape_what_a_terminal_acts_on_and_keep_their_own_breaks(name: str) -> None:
    formatter = TerminalFormatter("%(levelname)s: %(message)s")
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "%s: missing\nsecond", (name,), None
    )
    first, second = formatter.format(record).split("\n")
    assert first == f"WARNING: {terminal_text(name)}: missing" and second == "second"
