"""tiling's atomic-file helper: the target appears only complete, a failed write leaves nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tiling._atomic import replaced_when_done


def test_the_target_appears_only_when_the_write_completed(tmp_path: Path) -> None:
    target = tmp_path / "scene.tif"
    target.write_text("old")
    with replaced_when_done(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".scene.tif.")
        tmp.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["scene.tif"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "scene.tif"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt), replaced_when_done(target) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["scene.tif"]


def test_a_full_disk_names_the_target_not_the_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "scene.tif"
    with (
        pytest.raises(OSError, match=r"No space left on device") as info,
        replaced_when_done(target) as tmp,
    ):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []
