"""Config fields that declare their command-line flag: `Flag`, `flag`, `option`.

A command's config is a frozen dataclass; each field that is an option carries, in its
metadata, how it is written on a command line and its help (plain data, no click). The CLI
(`landcover.cliconfig`) generates the command's click options from those fields, so each
option's default, help and check exist once: in the config that the library takes (e.g.
`tiling.tiler.config.TileConfig`, `landcover.training.config.TrainConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Flag", "flag", "option"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    """How a config field is written on a command line: `--name VALUE`, a boolean flag
    (`--name`, and `off` for the form that sets it False), or a positional argument (a name
    without dashes: its metavar). `deprecated`: old spellings still accepted, with a warning."""

    name: str
    help: str | None = None
    off: str | None = None
    deprecated: tuple[str, ...] = ()

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")


def flag(name: str, help: str | None = None) -> dict[str, Flag]:
    """The metadata of a field without a default (a positional argument or a required
    option): `field(metadata=flag("--out", "..."))`, which type checkers read as a field."""
    return {"flag": Flag(name, help)}


def option(
    flag: str,
    default: T,
    help: str | None = None,
    *,
    off: str | None = None,
    deprecated: tuple[str, ...] = (),
) -> T:
    """A field with a default, written on a command line as `flag` (see `Flag`)."""
    return field(default=default, metadata={"flag": Flag(flag, help, off, deprecated)})
