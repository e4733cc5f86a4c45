"""Expanding inputs: paths, quoted globs, directories and URLs into raster paths, in order."""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tiling.errors import SourceNotFoundError
from tiling.urls import filesystem, is_local, local_path, storage_errors

RASTER_SUFFIXES = (".tif", ".tiff", ".TIF", ".TIFF", ".vrt")


def expand_inputs(
    patterns: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    what: str = "image",
) -> tuple[str, ...]:
    """Paths, quoted globs, directories and URLs → sorted unique raster paths/URLs.

    Order: patterns in the order given, matches of each pattern sorted; duplicates dropped.
    """
    found: list[str] = []
    for pattern in patterns:
        matches = _expand_one(pattern, storage_options)
        if not matches:
            raise SourceNotFoundError(
                f"no {what} files match {pattern!r}; check the path "
                "(quote globs so the shell does not expand them, e.g. 'naip/*.tif')"
            )
        found.extend(m for m in matches if m not in found)
    return tuple(found)


def _expand_one(pattern: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    if is_local(pattern):
        path = str(local_path(pattern))
        if os.path.isdir(path):
            return sorted(
                os.path.join(path, f)
                for f in os.listdir(path)
                if f.endswith(RASTER_SUFFIXES) and os.path.isfile(os.path.join(path, f))
            )
        if globlib.has_magic(path):
            return sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
        return [path] if os.path.isfile(path) else []
    fs, path = filesystem(pattern, storage_options)
    protocol = pattern.split("://", 1)[0]
    with storage_errors(pattern):
        if globlib.has_magic(path):
            hits = sorted(fs.glob(path))
        elif fs.isdir(path):
            hits = sorted(p for p in fs.ls(path, detail=False) if p.endswith(RASTER_SUFFIXES))
        else:
            hits = [path] if fs.exists(path) else []
    return [f"{protocol}://{h}" for h in hits]
