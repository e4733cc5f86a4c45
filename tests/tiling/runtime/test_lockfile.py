"""Whether a held lock file is still the one at its path (`tiling.runtime.lockfile`)."""

from __future__ import annotations

import os
from pathlib import Path

from tiling.runtime.lockfile import still_at


def test_an_open_lock_file_is_at_its_path_until_removed_or_replaced(tmp_path: Path) -> None:
    lock = tmp_path / "out.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert still_at(fd, lock)
        os.unlink(lock)  # its last holder removed it
        assert not still_at(fd, lock)
        lock.write_text("")  # and the next taker made a new one
        assert not still_at(fd, lock)
    finally:
        os.close(fd)
