"""cluster's one atomic file write (it cannot import `landcover.atomic`, the package's own).

A temp file beside the target (same file system, so the rename is atomic), with the mode a plain
`open(path, "w")` would give, renamed over the target: a reader sees the old file or the whole
new one, never half of either.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Replace `path` by `text` (UTF-8); `mode` (e.g. 0o755 for a script) or the umask's
    default. The temp file is removed on any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)  # the only way to read it: set and restore
    os.umask(current)
    return current
