"""Why a write failed, in one line: the path, the cause (a full disk, a file size limit, a
read-only file system, no permission) and the fix, for plain writes (`OSError`s) and for GDAL's
raster writes, whose errors carry only text."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from landcover.errors import OutputError
from tiling.runtime.atomic import FULL_ERRNOS, WRITE_FAILURE_ERRNOS

__all__ = ["raster_write_errors", "raster_write_refusal", "write_failure_message"]


def write_failure_message(path: str | os.PathLike[str], exc: OSError) -> str:
    """The one line for an output the file system refused (`exc`, one of
    `WRITE_FAILURE_ERRNOS`): the path, the reason and the fix."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno == errno.EFBIG:
        fix = _SIZE_LIMIT_FIX
    elif exc.errno in FULL_ERRNOS:
        fix = "free some space there or choose another output"
    elif exc.errno == errno.EROFS:
        fix = "choose an output on a writable file system"
    else:
        fix = "check its permissions or choose a writable directory"
    return f"{path}: cannot write it ({reason}); {fix}"


_SIZE_LIMIT_FIX = "raise the file size limit (ulimit -f) or choose another output"
# Below this many free bytes, a write that GDAL reports only as failed is a full disk.
_NEARLY_FULL_BYTES = 16 << 20


@contextmanager
def raster_write_errors(output: str | os.PathLike[str]) -> Iterator[None]:
    """GDAL's failures while writing the local `output` (or its temp files) that the file
    system caused, as `OutputError`: one line naming `output`, the cause and the fix.

    GDAL reports a full disk or a file over `ulimit -f` (EFBIG) as a failed write or, later,
    as a file it cannot read back ("not recognized as being in a supported file format"),
    never with the errno: the cause is read from the error's text and, failing that, from
    the file system's free space and the process's file size limit. Other errors pass."""
    try:
        yield
    except (OutputError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        message = raster_write_refusal(output, exc)
        if message is None:
            raise
        raise OutputError(message) from exc


def raster_write_refusal(output: str | os.PathLike[str], exc: BaseException) -> str | None:
    """The one line for `exc`, raised while writing `output`, when the file system refused
    the write (see `raster_write_errors`); None for any other error (our own input errors
    included)."""
    if isinstance(exc, ValueError):  # landcover's and tiling's errors: said already
        return None
    chain: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and len(chain) < 16:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    for error in chain:
        if isinstance(error, OSError) and error.errno in WRITE_FAILURE_ERRNOS:
            return write_failure_message(output, error)
    if not any(type(e).__module__.startswith(("rasterio", "osgeo")) for e in chain):
        return None
    text = " ".join(str(e) for e in chain).lower()
    limit = _file_size_limit()
    said_write = any(said in text for said in _GDAL_WRITE_FAILURES)
    if "file too large" in text or (limit is not None and said_write):
        shown = f" of {limit:,} bytes" if limit is not None else ""
        return f"{output}: cannot write it (a file size limit{shown}); {_SIZE_LIMIT_FIX}"
    free = _free_bytes(output)
    if "no space left" in text or (free is not None and free < _NEARLY_FULL_BYTES):
        left = f", {free:,} bytes free" if free is not None else ""
        return (
            f"{output}: cannot write it (No space left on device{left}); free some space "
            "there or choose another output"
        )
    return None


# How GDAL words a write the file system cut short (lower-cased), at the write or when the
# cut file is read back.
_GDAL_WRITE_FAILURES = (
    "write",
    "no space left",
    "file too large",
    "not recognized as being in a supported file format",
    "failed to read directory",
    "seek",
)


def _file_size_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _free_bytes(output: str | os.PathLike[str]) -> int | None:
    folder = Path(output).absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None:
        return None
    try:
        stats = os.statvfs(existing)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize
