"""Completion records: the small JSON file that commits a staged part.

A part's record is published after the files it vouches for, with the part's key and each
file's size. A reader trusts a part only through its record: no record, no part (a
half-written part has none); a record that does not parse, names another part or key, or
whose files are missing or of other sizes is ignored, logged, and the part made again. Each
stage defines its record type (`to_json` opening with `record_header`, `from_json` with
`check_format`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tiling.staged.folder import StagedFolder

logger = logging.getLogger(__name__)

R = TypeVar("R")


def record_header(format_name: str, version: int) -> dict[str, Any]:
    """The opening fields of a record (or key content) of `format_name` at `version`: what
    `check_format` reads back."""
    return {"format": format_name, "version": version}


def check_format(obj: Mapping[str, Any], format_name: str, version: int) -> None:
    """Refuse (ValueError) a record of another format or version."""
    if obj.get("format") != format_name or obj.get("version") != version:
        raise ValueError(f"not a {format_name} record of version {version}")


def publish_record(folder: StagedFolder, name: str, obj: Mapping[str, Any]) -> None:
    """Commit a part: publish its record `obj` as `name`, after the part's files."""
    folder.put_bytes(name, json.dumps(obj, indent=1).encode())


def read_record(
    folder: StagedFolder, name: str, parse: Callable[[Mapping[str, Any]], R]
) -> R | None:
    """The record published as `name`, parsed; None when there is none (yet) or it does not
    parse (logged: the part is made again)."""
    data = folder.read_bytes(name)
    if data is None:
        return None
    try:
        return parse(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring %s: unreadable record (%s)", folder.path(name), exc)
        return None


def files_intact(folder: StagedFolder, name: str, file_bytes: Mapping[str, int]) -> bool:
    """Whether every file a record (`name`) vouches for has its recorded size (name → bytes);
    logged when one does not."""
    for file, expected in file_bytes.items():
        actual = folder.size(file)
        if actual != expected:
            logger.warning(
                "ignoring %s: %s has %s bytes, not %d",
                folder.path(name),
                folder.path(file),
                actual,
                expected,
            )
            return False
    return True
