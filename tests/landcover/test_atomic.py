"""Output files: the overwrite policy; atomic writes get the permissions of a plain open(), fsync,
and nothing half-written on failure."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from landcover import atomic
from landcover.atomic import refuse_existing, write_atomic, write_bytes_atomic
from landcover.errors import OutputExistsError
from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.training.rundir import write_json_atomic
from tiling.classes import get_class_map


@pytest.fixture
def umask() -> Iterator[object]:
    """Set the process umask for one test: `umask(0o027)`; restored afterwards."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _meta() -> ModelMeta:
    return ModelMeta(
        architecture="tiny",
        class_map=get_class_map("chesapeake7to5"),
        band_names=("red", "green", "blue", "nir"),
        band_mean=(0.0,) * 4,
        band_std=(1.0,) * 4,
        chip_size=64,
        resolution_m=1.0,
    )


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_model_file_and_run_json_get_the_umask_permissions(
    tmp_path: Path, umask: object, mask: int, expected: int
) -> None:
    os.umask(mask)
    save_model_file(tmp_path / "model.pt", nn.Conv2d(4, 5, 1), _meta())
    write_json_atomic(tmp_path / "run.json", {"a": 1})
    write_bytes_atomic(tmp_path / "report.md", b"# report\n")
    for name in ("model.pt", "run.json", "report.md"):
        assert mode(tmp_path / name) == expected, name
    assert atomic.default_file_mode() == expected


def test_replacing_a_file_keeps_its_mode(tmp_path: Path, umask: object) -> None:
    os.umask(0o022)
    target = tmp_path / "model.pt"
    target.write_bytes(b"old")
    target.chmod(0o600)  # made private on purpose: a retrain must not widen it
    write_atomic(target, lambda tmp: torch.save({"w": torch.zeros(2)}, tmp))
    assert mode(target) == 0o600
    assert torch.load(target, weights_only=True)["w"].tolist() == [0.0, 0.0]


def test_a_failure_mid_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise KeyboardInterrupt  # what SIGTERM or Ctrl-C raises through the CLI

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_the_file_and_its_directory_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", record)
    write_bytes_atomic(tmp_path / "out" / "report.html", b"<html></html>")
    assert len(synced) == 2
    assert Path(synced[0]).parent == tmp_path / "out"  # the temp file, before the rename
    assert Path(synced[0]).name.startswith(".report.html.")
    assert Path(synced[1]) == tmp_path / "out"  # the directory, after it


def test_refuse_existing_names_the_first_existing_output_and_the_fix(tmp_path: Path) -> None:
    absent, present = tmp_path / "a.json", tmp_path / "b.json"
    present.write_text("{}")
    with pytest.raises(
        OutputExistsError, match=rf"^{present} exists; pass --overwrite to replace it$"
    ):
        refuse_existing([absent, present], overwrite=False)
    with pytest.raises(FileExistsError, match=r"pass --overwrite to replace the plan files$"):
        refuse_existing([present], overwrite=False, what="the plan files")


def test_refuse_existing_lets_overwrite_and_new_outputs_through(tmp_path: Path) -> None:
    present = tmp_path / "b.json"
    present.write_text("{}")
    refuse_existing([present], overwrite=True)
    refuse_existing([tmp_path / "new.json"], overwrite=False)
