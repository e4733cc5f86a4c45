"""Error classes of the tiling package.

Each subclasses the matching built-in as well, so callers can catch either
(`except FileNotFoundError` still works for a missing source). Messages name the
bad value and the fix; the CLI prints them as one line.
"""

from __future__ import annotations


class TilingError(ValueError):
    """Base class: bad input to tiling or a chip store that cannot be used."""


class SourceNotFoundError(TilingError, FileNotFoundError):
    """A path, glob or URL matched no raster."""


class SourceFormatError(TilingError):
    """A raster exists but is not usable (bands, dtype, CRS, corrupt file)."""


class LabelError(TilingError):
    """Label rasters that do not overlap an image or hold values outside the class map."""


class StoreError(TilingError):
    """A chip store that is missing, exists already, is corrupt or has a newer format."""


class StoreExistsError(StoreError, FileExistsError):
    """The output store exists and neither --overwrite nor resume applies."""


class StorageAccessError(TilingError, OSError):
    """A storage URL (az://, ...) that cannot be reached or options that are not valid."""


class StoreCorruptError(StoreError):
    """Shard objects of a store that are missing or do not match their checksums."""


class SourceChangedError(StoreError):
    """An input that changed since it was tiled into the store being resumed."""


def reason(exc: BaseException) -> str:
    """The first line of `exc`'s message (its type's name when it has none): a library's
    reason, to quote inside a one-line error. Only the reason is cut: a user's value around
    it (a file name with a line break) stays whole, for the command line to show escaped."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
