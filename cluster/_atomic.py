"""cluster's one atomic file write (it cannot import `landcover.atomic`, the package's own).

A temp file beside the target (same file system, so the rename is atomic), with the mode a plain
`open(path, "w")` would give, renamed over the target: a reader sees the old file or the whole
new one, never half of either. Without `overwrite` the temp file is hard-linked to the target
instead, which fails (FileExistsError) if anything appeared there since the caller's check: it
is never replaced. A file system's refusal (full, read-only, no permission) is raised as an
OSError of the same errno naming the target, not the temp file, for the one line the CLI
prints.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

# The file system refuses to store the file: full, over quota, read-only, no permission.
_WRITE_FAILURE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)
# os.link on a file system without hard links (some FUSE and SMB mounts)
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}
)


def write_text_atomic(
    path: Path, text: str, *, mode: int | None = None, overwrite: bool = True
) -> None:
    """Put `text` (UTF-8) at `path`; `mode` (e.g. 0o755 for a script) or the umask's
    default. The temp file is removed on any failure."""
    write_texts_atomic([(path, text, mode)], overwrite=overwrite)


def write_texts_atomic(files: Sequence[tuple[Path, str, int | None]], *, overwrite: bool) -> None:
    """`write_text_atomic` of several (path, text, mode), all or nothing: every temp file is
    complete before the first is put in place; a failure removes the temp files, and without
    `overwrite` also the files this call already put in place."""
    staged: list[tuple[Path, str]] = []
    placed: list[Path] = []
    current = Path()
    try:
        for path, text, mode in files:
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((path, tmp))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        for current, tmp in staged:
            _publish(tmp, current, overwrite=overwrite)
            placed.append(current)
    except BaseException as exc:
        for _, leftover in staged:
            Path(leftover).unlink(missing_ok=True)
        if not overwrite:  # only new files were placed: nothing of the user's goes
            for done in placed:
                done.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (*_WRITE_FAILURE_ERRNOS, errno.EEXIST):
            raise OSError(exc.errno, exc.strerror, str(current)) from exc  # the file, not the temp
        raise


def _publish(tmp: str, target: Path, *, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _umask() -> int:
    current = os.umask(0)  # the only way to read it: set and restore
    os.umask(current)
    return current
