"""Output files: the overwrite policy; atomic writes get the permissions of a plain open(), fsync,
and nothing half-written on failure."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from landcover.change.changemap import check_change_target
from landcover.errors import ChangeError, EvaluationError, OutputError, OutputExistsError
from landcover.evaluation.report import check_report_target
from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.outputs import (
    check_directory_output,
    check_output_file,
    refuse_existing,
    require_distinct,
    write_atomic,
    write_bytes_atomic,
    write_files_atomic,
)
from landcover.training.rundir import write_json_atomic
from tiling.runtime import atomic
from tiling.sources.classes import get_class_map


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


def test_several_files_are_written_all_or_none(tmp_path: Path) -> None:
    first, second = tmp_path / "r" / "metrics.json", tmp_path / "r" / "confusion.png"

    def full(tmp: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)

    with pytest.raises(OutputError) as info:
        write_files_atomic(
            [(first, lambda tmp: Path(tmp).write_text("{}")), (second, full)], overwrite=False
        )
    assert str(info.value) == (
        f"{second}: cannot write it (No space left on device); free some space there or "
        "choose another output"
    )
    assert list((tmp_path / "r").iterdir()) == []  # neither file, no temp file


def test_without_overwrite_a_file_that_appeared_is_kept_even_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "lc.json"

    def no_hard_links(src: str, dst: str) -> None:
        target.write_text("the user's")  # appeared after the command's check
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), src)

    monkeypatch.setattr(os, "link", no_hard_links)
    with pytest.raises(OutputExistsError, match=rf"^{target} exists; pass --overwrite"):
        write_bytes_atomic(target, b"{}", overwrite=False)
    assert target.read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lc.json"]


def test_outputs_that_are_one_file_however_spelled_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.tif").write_bytes(b"x")
    os.link(tmp_path / "a.tif", tmp_path / "hard.tif")
    with pytest.raises(OutputError, match=r"--out .* and --probabilities .* are the same file"):
        require_distinct(
            [("--out", str(tmp_path / "a.tif")), ("--probabilities", f"{tmp_path}/hard.tif")]
        )
    with pytest.raises(OutputError, match=r"--out az://c/x\.tif is the image az://c/x\.tif/"):
        require_distinct([("--out", "az://c/x.tif")], inputs=[("image", "az://c/x.tif/")])
    require_distinct([("--out", str(tmp_path / "a.tif")), ("--stac-item", None)])
    require_distinct([("--out", "az://c/a.tif"), ("--probabilities", "az://c/b.tif")])


@pytest.mark.parametrize("spelled", ["{d}/", "{d}", "./{d}/"])
def test_an_output_directory_that_holds_an_input_is_refused(
    spelled: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: a tiled product in the directory of its images was made, then its rerun
    read its own tiles as images ("expected 4 bands")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "scene.tif").write_bytes(b"x")
    out = spelled.format(d="g")
    with pytest.raises(OutputError) as refused:
        require_distinct([("--out", out)], inputs=[("image", "g/scene.tif")])
    assert str(refused.value) == (
        f"--out {out} holds the image g/scene.tif: a rerun would read the outputs written there "
        "back as inputs; keep the inputs outside --out, or choose another --out"
    )
    with pytest.raises(OutputError, match=r"holds the image az://c/p/a\.tif"):
        require_distinct([("--out", "az://c/p/")], inputs=[("image", "az://c/p/a.tif")])
    require_distinct([("--out", "gx/")], inputs=[("image", "g/scene.tif")])
    require_distinct([("--out", "g/lc.tif")], inputs=[("image", "g/scene.tif")])  # a file


def test_an_output_file_is_checked_before_the_work(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=rf"^--out {tmp_path} is a directory; give a file"):
        check_output_file(tmp_path, option="--out", overwrite=True, example="lc.tif")
    (tmp_path / "dangling.tif").symlink_to(tmp_path / "nowhere.tif")
    with pytest.raises(OutputExistsError):
        check_output_file(tmp_path / "dangling.tif", option="--out", overwrite=False, example="x")
    with pytest.raises(OutputError, match=r"^--out /proc/x/lc\.tif: cannot create files in /proc"):
        check_output_file("/proc/x/lc.tif", option="--out", overwrite=False, example="lc.tif")
    check_output_file(tmp_path / "new" / "lc.tif", option="--out", overwrite=False, example="x")
    assert list(tmp_path.iterdir()) == [tmp_path / "dangling.tif"]  # the probe is gone


@pytest.mark.parametrize(
    ("check", "error", "fix"),
    [
        (
            lambda out: check_directory_output(out, overwrite=False, what="x", owned=bool),
            OutputError,
            "choose another --out",
        ),
        (
            lambda out: check_change_target(out, overwrite=False),
            ChangeError,
            "give a directory for change.tif",
        ),
        (
            lambda out: check_report_target(out, overwrite=False),
            EvaluationError,
            "give a directory for metrics.json",
        ),
    ],
    ids=["directory-output", "change", "evaluation-report"],
)
def test_an_output_directory_that_is_a_file_is_one_line_of_the_commands_error(
    tmp_path: Path, check: Callable[[Path], object], error: type[Exception], fix: str
) -> None:
    """`output_directory` is every directory output's check: a file at --out is refused with
    the command's own error class, naming the option and the fix."""
    taken = tmp_path / "taken"
    taken.write_text("a user's file")
    with pytest.raises(error) as caught:
        check(taken)
    assert str(caught.value).startswith(f"--out {taken}: exists and is not a directory; {fix}")
    assert taken.read_text() == "a user's file"
