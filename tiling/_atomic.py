"""tiling's one atomic-file helper (tiling cannot import `landcover.atomic`): write under a
temporary name beside the target, rename over it only when the write completed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_when_done(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (`.<name>.<random>.tmp`, landcover's scheme) to write;
    renamed over `path` when the block ends, removed when it raises (Ctrl-C included), so a
    reader never sees a half-written file and a failed write leaves nothing behind."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
