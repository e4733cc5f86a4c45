"""The shared atomic writer: the target appears only complete and durable (file and directory
fsynced), a failed write leaves nothing, a refusal names the target."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tiling.runtime import atomic
from tiling.runtime.atomic import (
    publish,
    replaced_when_done,
    text_writer,
    write_files_atomic,
    write_text_atomic,
)


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


def test_every_writer_fsyncs_the_file_then_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One durability policy: the GeoTIFF writer's context and the one-call writers alike."""
    synced: list[Path] = []
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(Path(f"/proc/self/fd/{fd}").readlink())
    )
    with replaced_when_done(tmp_path / "scene.tif") as tmp:
        tmp.write_text("pixels")
    write_text_atomic(tmp_path / "plan" / "job.sh", "#!/bin/sh\n", mode=0o755)
    assert len(synced) == 4
    assert synced[0].name.startswith(".scene.tif.") and synced[1] == tmp_path
    assert synced[2].name.startswith(".job.sh.") and synced[3] == tmp_path / "plan"
    assert stat.S_IMODE((tmp_path / "plan" / "job.sh").stat().st_mode) == 0o755


def test_without_overwrite_a_file_that_appeared_is_kept_and_named(tmp_path: Path) -> None:
    first, second = tmp_path / "plan.txt", tmp_path / "job.sh"
    second.write_text("the user's")
    with pytest.raises(FileExistsError) as info:
        write_files_atomic(
            [(first, text_writer("plan")), (second, text_writer("script"))], overwrite=False
        )
    assert info.value.filename == str(second)
    assert second.read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]  # plan.txt taken back


def test_publish_puts_a_finished_file_in_place_and_names_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finished = tmp_path / ".part.tmp"
    finished.write_text("part")
    publish(finished, tmp_path / "part.bin")
    assert (tmp_path / "part.bin").read_text() == "part" and not finished.exists()

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))

    finished.write_text("again")
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left") as info:
        publish(finished, tmp_path / "part.bin")
    assert info.value.filename == str(tmp_path / "part.bin")


def test_only_dead_writers_temps_of_this_host_are_removed(tmp_path: Path) -> None:
    """The sweep a write makes: a killed writer's temp file and its side file go; a live
    writer's (this process), another host's, and a user's file of a like name stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    me = atomic._writer_id()
    host = me.rsplit("-", 1)[0]
    gone = [f".a.tif.{host}-{pid}.abc123_x.tmp", f".b.gpkg.{host}-{pid}.q1w2e3r4.tmp.gpkg"]
    kept = [f".a.tif.{me}.zz9y8x7w.tmp", f".a.tif.otherhost{host}-{pid}.abcdefgh.tmp",
            f"a.tif.{host}-{pid}.abcdefgh.tmp", ".a.tif.abcdefgh.tmp", "a.tif"]  # fmt: skip
    for name in [*gone, *kept]:
        (tmp_path / name).write_text("x")
    assert sorted(atomic.remove_dead_writers_temps(tmp_path)) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
