"""Lock files that their holder removes when it is done (a writer's output lock, a scratch
directory's lock).

Between opening such a file and taking its flock, the last holder may have removed it: the
flock is then held on a file no one else will ever open, and guards nothing. A taker checks
`still_at` after the flock and, when it fails, opens the path again.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["still_at"]


def still_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not removed or replaced)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
