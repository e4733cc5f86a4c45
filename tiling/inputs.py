"""Expanding inputs: paths, quoted globs, directories, URLs and STAC documents or searches into
raster paths, in order."""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiling.errors import SourceNotFoundError
from tiling.stac import stac_sources
from tiling.stacquery import StacOptions, StacSource, is_stac_document
from tiling.urls import filesystem, is_local, local_path, protocol, storage_errors

RASTER_SUFFIXES = (".tif", ".tiff", ".TIF", ".TIFF", ".vrt")


# Plain http(s) URLs are taken as they are: HTTP cannot list or glob, and the `?` of a
# signed URL's query is not a wildcard.
LITERAL_PROTOCOLS = ("http", "https")


@dataclass(frozen=True, slots=True)
class Inputs:
    """Expanded inputs: raster paths/URLs in order, and the STAC items some of them came from."""

    paths: tuple[str, ...]
    stac_items: tuple[StacSource, ...] = ()


def resolve_inputs(
    patterns: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    what: str = "image",
    stac: StacOptions | None = None,
) -> Inputs:
    """Paths, quoted globs, directories, URLs and STAC documents (+ `stac.search`) → rasters.

    Order: raster patterns in the order given, matches of each pattern sorted; then the
    rasters of the STAC items (one per place, chosen over all STAC inputs together, sorted
    by href; `tiling.stac`). Duplicates dropped.
    """
    stac = stac or StacOptions()
    found: list[str] = []
    documents = [p for p in patterns if is_stac_document(p)]
    for pattern in patterns:
        if pattern in documents:
            continue
        matches = _expand_one(pattern, storage_options)
        if not matches:
            raise SourceNotFoundError(
                f"no {what} files match {pattern!r}; check the path "
                "(quote globs so the shell does not expand them, e.g. 'naip/*.tif')"
            )
        found.extend(m for m in matches if m not in found)
    items: tuple[StacSource, ...] = ()
    if documents or stac.search is not None:
        items = stac_sources(documents, stac, storage_options=storage_options)
        found.extend(s.href for s in items if s.href not in found)
    return Inputs(paths=tuple(found), stac_items=items)


def expand_inputs(
    patterns: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    what: str = "image",
    stac: StacOptions | None = None,
) -> tuple[str, ...]:
    """Paths, quoted globs, directories, URLs and STAC inputs → unique raster paths/URLs
    (`resolve_inputs` without the STAC items)."""
    return resolve_inputs(patterns, storage_options=storage_options, what=what, stac=stac).paths


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
    if protocol(pattern) in LITERAL_PROTOCOLS:
        return [pattern]
    fs, path = filesystem(pattern, storage_options)
    scheme = pattern.split("://", 1)[0]
    with storage_errors(pattern):
        if globlib.has_magic(path):
            hits = sorted(fs.glob(path))
        elif fs.isdir(path):
            hits = sorted(p for p in fs.ls(path, detail=False) if p.endswith(RASTER_SUFFIXES))
        else:
            hits = [path] if fs.exists(path) else []
    return [f"{scheme}://{h}" for h in hits]
