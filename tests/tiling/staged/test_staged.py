"""The staged-parts protocol (tiling.staged): keys, whole publishing, completion records and
the waits that tile and predict share."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tiling.staged import (
    PollSchedule,
    StagedFolder,
    check_format,
    content_key,
    files_intact,
    poll,
    publish_record,
    read_record,
    staging_url,
    wait_for_records,
    wait_until,
)

FAST = PollSchedule(first_s=0.001, max_s=0.01)


def test_a_key_depends_on_the_content_alone() -> None:
    one = content_key({"format": "x", "version": 1, "inputs": ["a", "b"]})
    assert one == content_key({"inputs": ["a", "b"], "version": 1, "format": "x"})
    assert one != content_key({"format": "x", "version": 1, "inputs": ["b", "a"]})
    assert len(one) == 24 and len(content_key({}, hex_digits=16)) == 16


def test_files_are_published_whole_and_read_afresh(tmp_path: Path) -> None:
    folder = StagedFolder(staging_url(str(tmp_path / "out.zarr")))
    assert folder.url == f"{tmp_path / 'out.zarr'}.parts"
    assert folder.names() == set() and folder.read_bytes("a") is None and folder.size("a") is None
    folder.put_bytes("a", [b"he", b"llo"])  # pieces, written one after the other
    folder.put_many({"b": b"", "sub/c": b"x"})
    assert folder.read_bytes("a") == b"hello" and folder.read_bytes("b") == b""
    assert folder.names() == {"a", "b", "sub"} and folder.names("sub") == {"c"}  # no temp left
    with folder.scratch() as scratch:
        # local: a hidden directory in the folder, on its file system (a rename is atomic)
        assert Path(scratch).parent == Path(folder.root) and Path(scratch).name.startswith(".")
        (Path(scratch) / ".d.tmp").write_bytes(b"data")
        folder.put_file(str(Path(scratch) / ".d.tmp"), "d")
    assert not Path(scratch).exists() and not any(n.startswith(".") for n in folder.names())
    assert folder.size("d") == 4 and folder.fetch("d", "unused") == folder.path("d")
    folder.remove()
    assert not Path(folder.root).exists()
    folder.remove()  # twice is fine


def test_a_record_counts_only_when_it_parses_and_its_files_have_their_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = StagedFolder(str(tmp_path / "parts"))

    def parse(obj: object) -> dict[str, int]:
        assert isinstance(obj, dict)
        check_format(obj, "thing", 1)
        return {str(k): int(v) for k, v in obj["file_bytes"].items()}

    assert read_record(folder, "r.json", parse) is None  # none yet
    folder.put_bytes("f", b"1234")
    publish_record(folder, "r.json", {"format": "thing", "version": 1, "file_bytes": {"f": 4}})
    sizes = read_record(folder, "r.json", parse)
    assert sizes == {"f": 4} and files_intact(folder, "r.json", sizes)
    folder.put_bytes("f", b"12")
    assert not files_intact(folder, "r.json", sizes)
    assert f"ignoring {folder.path('r.json')}: {folder.path('f')} has 2 bytes, not 4" in caplog.text
    publish_record(folder, "r.json", {"format": "thing", "version": 2, "file_bytes": {}})
    assert read_record(folder, "r.json", parse) is None
    assert "unreadable record (not a thing record of version 1)" in caplog.text
    folder.put_bytes("r.json", b"{not json")
    assert read_record(folder, "r.json", parse) is None


def test_poll_returns_what_it_finds_gives_up_or_is_abandoned(tmp_path: Path) -> None:
    looks: list[int] = []

    def find() -> int | None:
        looks.append(1)
        return 0 if len(looks) == 3 else None  # 0 is found, not missing

    assert poll(find, url=str(tmp_path), schedule=FAST) == 0 and len(looks) == 3
    assert poll(lambda: None, url=str(tmp_path), schedule=FAST, give_up=lambda: True) is None

    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_until(lambda: None, url=str(tmp_path), schedule=FAST, check=stop)


def test_waiting_for_records_lists_once_a_look_and_keeps_only_good_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = StagedFolder(str(tmp_path / "parts"))
    monkeypatch.setattr("tiling.staged.wait.WAIT_LOG_EVERY_S", 0.0)
    waited: list[list[int]] = []

    def read(rank: int) -> str | None:
        body = folder.read_bytes(f"{rank}.json")
        return None if body is None or body == b"bad" else json.loads(body)

    def late() -> None:
        time.sleep(0.05)
        folder.put_bytes("1.json", b"bad")  # a record that does not check out is not used
        time.sleep(0.05)
        folder.put_bytes("1.json", b'"one"')

    folder.put_bytes("0.json", b'"zero"')
    writer = threading.Thread(target=late)
    writer.start()
    found = wait_for_records(
        folder,
        {0: "0.json", 1: "1.json"},
        read,
        schedule=FAST,
        waiting=lambda seconds, pending: waited.append(pending),
    )
    writer.join()
    assert found == {0: "zero", 1: "one"}
    assert waited and all(pending == [1] for pending in waited)


def test_a_file_from_another_file_system_is_copied_beside_then_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename across file systems fails with EXDEV: the file is copied beside its name
    first, then renamed, and the source removed."""
    folder = StagedFolder(str(tmp_path / "out"))
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(b"whole")
    real_replace = os.replace

    def across(src: Any, dst: Any) -> None:
        if Path(os.fspath(src)) == elsewhere:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), os.fspath(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", across)
    folder.put_file(str(elsewhere), "sub/f")
    assert folder.read_bytes("sub/f") == b"whole" and not elsewhere.exists()
    assert folder.names("sub") == {"f"}


def test_a_full_local_disk_stays_the_file_systems_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "check the URL and --storage-options": a local folder has neither."""
    folder = StagedFolder(str(tmp_path / "out"))

    def full(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(src))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError) as caught:
        folder.put_bytes("records/a.json", b"{}")
    assert caught.value.errno == errno.ENOSPC and "storage-options" not in str(caught.value)
    assert caught.value.filename == folder.path("records/a.json")
    assert folder.names("records") == set()
