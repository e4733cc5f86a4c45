"""tiling's one atomic-file helper (tiling cannot import `landcover.atomic`): write under a
temporary name beside the target, rename over it only when the write completed."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The file system refuses to store the file: full, over quota, read-only, no permission.
_WRITE_FAILURE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)


@contextmanager
def replaced_when_done(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (`.<name>.<random>.tmp`, landcover's scheme) to write;
    renamed over `path` when the block ends, removed when it raises (Ctrl-C included), so a
    reader never sees a half-written file and a failed write leaves nothing behind. A file
    system's refusal (full, read-only, no permission) is raised as an OSError of the same
    errno naming `path`, not the temporary name, for the one line the CLI prints."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _WRITE_FAILURE_ERRNOS:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
