"""Expanding inputs: paths, quoted globs, directories, URLs and STAC documents or searches into
raster paths, in order, each input once.

One file can be named many ways: `a.tif` and `./a.tif` or `/data/a.tif`, a symlink and its
target, a STAC href and the path a glob found, `https://Host/a.tif` and `https://host/a.tif`.
Read twice, it would count twice (twice the chips, in both splits; twice the pixels in a
score), so every name is reduced to the input it stands for (`input_identity`) and each input
is kept once, under the first name given, with a warning naming both.
"""

from __future__ import annotations

import glob as globlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from tiling.errors import SourceNotFoundError
from tiling.runtime.urls import (
    AZURE_PROTOCOLS,
    filesystem,
    is_local,
    local_path,
    protocol,
    storage_errors,
)
from tiling.sources.bands import NUM_BANDS
from tiling.sources.stacquery import StacOptions, StacSource, is_stac_document

logger = logging.getLogger(__name__)

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
    by href; `tiling.sources.stac`). Duplicates dropped.
    """
    stac = stac or StacOptions()
    kept: dict[Any, str] = {}  # input_identity -> the name it is read under
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
        for match in matches:
            _keep_once(match, kept, what)
    items: dict[str, StacSource] = {}  # by the name its raster is read under
    if documents or stac.search is not None:
        # here, not at import: pystac and its HTTP stack cost a plain file run ~0.1 s
        from tiling.sources.stac import stac_sources

        bands = NUM_BANDS if what == "image" else None
        for source in stac_sources(documents, stac, storage_options=storage_options, bands=bands):
            name = _keep_once(source.href, kept, what)
            items.setdefault(name, replace(source, href=name))
    return Inputs(paths=tuple(kept.values()), stac_items=tuple(items.values()))


def input_identity(path: str) -> Any:
    """What a path or URL reads, the same for every name of it: a local file's device and
    inode (symlinks, `./`, `..`, relative and absolute paths, hard links alike); a URL with
    its scheme (and an HTTP host) in lower case, without a default port, `.` and `..`
    segments or a fragment, Azure's az://, abfs:// and abfss:// as one."""
    if is_local(path):
        local = local_path(path)
        try:
            stat = os.stat(local)
        except OSError:
            return ("file", os.path.realpath(local))
        return ("inode", stat.st_dev, stat.st_ino)
    split = urlsplit(path)
    scheme = split.scheme.lower()
    scheme = "az" if scheme in AZURE_PROTOCOLS else scheme
    host = split.netloc
    if scheme in LITERAL_PROTOCOLS:  # DNS names know no case; the default port is implied
        host = (split.hostname or "").lower()
        if split.port is not None and (scheme, split.port) not in (("http", 80), ("https", 443)):
            host = f"{host}:{split.port}"
    return (scheme, host, _without_dot_segments(split.path) or "/", split.query)


def _without_dot_segments(path: str) -> str:
    """A URL path with `.` and `..` segments resolved (RFC 3986, 5.2.4); `//` is kept, an
    object store's key may hold it."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if len(kept) > 1:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    if path.endswith(("/.", "/..")):
        kept.append("")
    return "/".join(kept)


def _keep_once(name: str, kept: dict[Any, str], what: str) -> str:
    """Add `name` to `kept` unless its input is there already under another name (or the
    same): then a warning names both, and the name it is read under is returned."""
    identity = input_identity(name)
    first = kept.get(identity)
    if first is None:
        kept[identity] = name
        return name
    if first == name:
        logger.warning("%s %s is given twice; reading it once", what, name)
    else:
        logger.warning("%s %s is the same file as %s; reading it once", what, name, first)
    return first


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
        # a file that exists is itself, even when its name holds glob characters ("x [1].tif")
        if os.path.isfile(path):
            return [path]
        if globlib.has_magic(path):
            return sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
        return []
    if protocol(pattern) in LITERAL_PROTOCOLS:
        return [pattern]
    fs, path = filesystem(pattern, storage_options)
    scheme = pattern.split("://", 1)[0]
    with storage_errors(pattern):
        if globlib.has_magic(path) and not fs.isfile(path):
            hits = sorted(fs.glob(path))
        elif fs.isdir(path):
            hits = sorted(p for p in fs.ls(path, detail=False) if p.endswith(RASTER_SUFFIXES))
        else:
            hits = [path] if fs.exists(path) else []
    return [f"{scheme}://{h}" for h in hits]
