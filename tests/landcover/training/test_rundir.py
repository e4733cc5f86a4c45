"""The run directory: refusing old results, atomic writes, metrics.jsonl, checkpoints."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from landcover import cli
from landcover.cli.app import USER_ERRORS
from landcover.cli.train import worker_command
from landcover.errors import TrainingError
from landcover.training import TrainConfig, train
from landcover.training.checkpoint import read_checkpoint, save_checkpoint
from landcover.training.records import RUN_KEYS
from landcover.training.rundir import (
    append_metrics,
    check_run_dir,
    jsonable,
    prepare_run_dir,
    read_metrics,
    removed_if_left_empty,
    rewrite_metrics,
    write_atomic,
    write_run_json,
)


def make_run(out: Path) -> None:
    """A run dir holding every kind of result."""
    out.mkdir(parents=True)
    append_metrics(out, {"epoch": 1})
    write_run_json(out, dict.fromkeys(RUN_KEYS, 1))
    (out / "model.pt").write_bytes(b"model")
    save_checkpoint(out, {"epoch": 1, "config": {}})


def test_old_results_are_refused_without_resume_or_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    check_run_dir(out, resume=False, overwrite=False)  # a new directory is fine
    make_run(out)
    with pytest.raises(TrainingError) as info:
        check_run_dir(out, resume=False, overwrite=False)
    assert str(info.value) == (
        f"{out}: already holds a training run (metrics.jsonl, run.json, model.pt, "
        "checkpoints); pass --resume to continue it or --overwrite to replace it"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainingError, match="exists and is not a directory; choose another"):
        check_run_dir(tmp_path / "file", resume=True, overwrite=False)


def test_prepare_resumes_from_the_checkpoint_or_clears_the_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    make_run(out)
    (out / "notes.txt").write_text("mine")
    assert prepare_run_dir(out, resume=True, overwrite=False) == out / "checkpoints" / "last.pt"
    assert read_metrics(out) == [{"epoch": 1}]
    assert prepare_run_dir(out, resume=False, overwrite=True) is None
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # only results are removed


NO_CHECKPOINT_FIX = (
    "it has no checkpoint to resume (checkpoints/last.pt); pass --overwrite to replace this "
    "run, or train into a new --out"
)


@pytest.mark.parametrize("resume", [False, True], ids=["plain", "resume"])
def test_a_run_without_its_checkpoint_is_refused_with_or_without_resume(
    resume: bool, tmp_path: Path
) -> None:
    """A finished run whose checkpoint was deleted (as the advice for a damaged one once said):
    --resume is refused as a plain rerun is, in one line naming the run dir and the fix, and
    nothing of the run is touched. The old code started fresh over model.pt and metrics.jsonl."""
    out = tmp_path / "run"
    make_run(out)
    (out / "checkpoints" / "last.pt").unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(TrainingError) as info:
        prepare_run_dir(out, resume=resume, overwrite=False)
    message = str(info.value)
    assert message.startswith(f"{out}: already holds a training run (") and "\n" not in message
    assert NO_CHECKPOINT_FIX.split(";")[0] in message
    assert message.endswith("pass --overwrite to replace this run, or train into a new --out")
    assert "pass --resume" not in message  # there is nothing to resume
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert prepare_run_dir(out, resume=False, overwrite=True) is None  # the fix it names works


def test_resume_starts_fresh_when_no_epoch_was_trained(tmp_path: Path) -> None:
    """A run stopped before its first checkpoint (run.json and tracking only, as a restarted
    worker group finds it): --resume starts it again."""
    out = tmp_path / "run"
    out.mkdir()
    write_run_json(out, dict.fromkeys(RUN_KEYS, 1))
    (out / "tensorboard").mkdir()
    assert prepare_run_dir(out, resume=True, overwrite=False) is None
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("trained", ["model.pt", "metrics.jsonl"])
def test_resume_refuses_any_trained_result_without_checkpoint(trained: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / trained).write_text("x")
    with pytest.raises(TrainingError, match=rf"\({trained}\); it has no checkpoint to resume"):
        check_run_dir(out, resume=True, overwrite=False)
    assert (out / trained).read_text() == "x"


def test_failed_block_removes_the_directories_it_made_when_empty(tmp_path: Path) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    out = existing / "new" / "deeper" / "run"
    with pytest.raises(OSError, match="boom"), removed_if_left_empty(out):
        out.mkdir(parents=True)
        raise OSError("boom")
    assert list(existing.iterdir()) == []  # new/deeper/run gone, the existing parent kept
    with pytest.raises(OSError, match="boom"), removed_if_left_empty(out):
        (existing / "new").mkdir()  # only a parent made (as a lock file's directory is)
        raise OSError("boom")
    assert list(existing.iterdir()) == []
    with pytest.raises(OSError, match="boom"), removed_if_left_empty(out):
        out.mkdir(parents=True)
        (out / "logs").mkdir()
        raise OSError("boom")
    assert (out / "logs").is_dir()  # what a failure left to read stays, with its parents
    with removed_if_left_empty(existing / "ok"):
        (existing / "ok").mkdir()
    assert (existing / "ok").is_dir()  # success keeps it


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("old")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_rewrite_metrics_replaces_every_line(tmp_path: Path) -> None:
    for epoch in (1, 2, 2):  # a repeated epoch, as a killed worker leaves it
        append_metrics(tmp_path, {"epoch": epoch, "val_miou": float("nan")})
    assert [m["epoch"] for m in read_metrics(tmp_path)] == [1, 2, 2]
    assert read_metrics(tmp_path)[0]["val_miou"] is None  # NaN is written as null
    rewrite_metrics(tmp_path, [{"epoch": 1}])
    assert read_metrics(tmp_path) == [{"epoch": 1}]
    assert read_metrics(tmp_path / "missing") == []


def test_run_json_must_hold_the_contract_keys(tmp_path: Path) -> None:
    info = {key: 1 for key in RUN_KEYS if key != "cores"}
    with pytest.raises(ValueError, match=r"run.json needs the keys \['cores'\]"):
        write_run_json(tmp_path, info)
    write_run_json(tmp_path, {**info, "cores": 2, "extra": np.float32(0.5)})
    assert json.loads((tmp_path / "run.json").read_text())["extra"] == 0.5


def test_checkpoint_round_trip_and_refusals(tmp_path: Path) -> None:
    config = {"model": "small_unet", "batch_size": 8}
    save_checkpoint(tmp_path, {"epoch": 3, "config": config, "model": {"w": torch.ones(2)}})
    path = tmp_path / "checkpoints" / "last.pt"
    payload = read_checkpoint(path, must_match={"model": "small_unet"})
    assert payload["epoch"] == 3 and torch.equal(payload["model"]["w"], torch.ones(2))
    with pytest.raises(TrainingError) as info:
        read_checkpoint(path, must_match={"batch_size": 16})
    assert str(info.value) == (
        f"{path}: checkpoint was trained with --batch-size 8, not 16; pass the same value, or "
        "pass --overwrite to replace this run, or train into a new --out"
    )
    torch.save({"epoch": 1}, path)
    with pytest.raises(TrainingError) as info:
        read_checkpoint(path, must_match={})
    assert str(info.value) == (
        f"{path}: not a landcover checkpoint, which --resume cannot continue; pass --overwrite "
        "to replace this run, or train into a new --out"
    )
    path.write_bytes(b"garbage")
    with pytest.raises(TrainingError) as info:
        read_checkpoint(path, must_match={})
    # No "delete it": a run dir with results and no checkpoint is refused too.
    assert str(info.value).startswith(f"{path}: unreadable checkpoint (")
    assert str(info.value).endswith(
        "which --resume cannot continue; pass --overwrite to replace this run, or train into a "
        "new --out"
    )


def test_jsonable_values() -> None:
    values = jsonable(
        {1: np.int64(2), "t": torch.tensor([1.5]), "nan": math.nan, "s": {3}, "p": Path("a")}
    )
    assert values == {"1": 2, "t": [1.5], "nan": None, "s": [3], "p": "a"}


# -- what `train` does with a run dir, through every entry point ------------------------------

TRAIN_OPTIONS = ["--epochs", "1", "--batch-size", "8", "--threads", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def finished_run(tiny_store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 1-epoch small_unet run (copied by each test that changes it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = CliRunner().invoke(cli.main, ["train", tiny_store, "--out", str(out), *TRAIN_OPTIONS])
    assert result.exit_code == 0, result.output
    return out


def run_train(entry: str, store: str, out: Path, *args: str) -> tuple[int, str]:
    """`train` through `entry`: the CLI in this process, the CLI's parent of 2 local workers,
    the worker command (`python -m landcover.training`) or the Python function; the exit code
    and the one error line (2 and the error's text for the function)."""
    argv = [store, "--out", str(out), *TRAIN_OPTIONS, *args]
    if entry == "api":
        try:
            train(TrainConfig.from_argv(argv))
        except USER_ERRORS as exc:
            return 2, str(exc)
        return 0, ""
    if entry == "worker":
        result = CliRunner().invoke(worker_command, argv)
    else:
        nproc = ["--nproc", "2"] if entry == "cli-nproc2" else []
        result = CliRunner().invoke(cli.main, ["train", *argv, *nproc])
    lines = result.output.strip().splitlines()
    return result.exit_code, lines[-1].removeprefix("error: ") if lines else ""


def files_of(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize("entry", ["cli", "cli-nproc2", "worker", "api"])
def test_resume_without_a_checkpoint_keeps_a_finished_run(
    entry: str, tiny_store: str, finished_run: Path, tmp_path: Path
) -> None:
    """issue 41: `--resume` over a finished run whose checkpoint is gone (deleted, as the old
    advice for a damaged one said) started fresh over its model.pt, metrics.jsonl and run.json.
    Every entry point refuses it in one line, as a rerun without --resume is, and leaves the
    run as it was."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "checkpoints" / "last.pt").unlink()
    before = files_of(run)
    code, line = run_train(entry, tiny_store, run, "--resume")
    assert code == 2
    assert line == (
        f"{run}: already holds a training run (model.pt, metrics.jsonl); it has no checkpoint "
        "to resume (checkpoints/last.pt), which --resume needs; pass --overwrite to replace "
        "this run, or train into a new --out"
    )
    assert files_of(run) == before
    plain_code, plain = run_train(entry, tiny_store, run)  # the same refusal without --resume
    assert plain_code == 2 and plain.endswith(NO_CHECKPOINT_FIX) and files_of(run) == before


def test_a_damaged_checkpoint_names_the_fix_that_keeps_the_run(
    tiny_store: str, finished_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "checkpoints" / "last.pt").write_bytes(b"damaged")
    before = files_of(run)
    code, line = run_train("cli", tiny_store, run, "--resume")
    assert code == 2 and "delete" not in line
    assert line.startswith(f"{run / 'checkpoints' / 'last.pt'}: unreadable checkpoint (")
    assert line.endswith("pass --overwrite to replace this run, or train into a new --out")
    assert files_of(run) == before


FAILURES = {
    "missing store": ("missing.zarr", []),
    "model name with a space": (None, ["--model", "small_unet "]),
    "pretrained for small_unet": (None, ["--pretrained", "imagenet"]),
}


@pytest.mark.parametrize("entry", ["cli", "worker", "api"])
@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_train_leaves_no_empty_run_dir(
    entry: str, failure: str, tiny_store: str, tmp_path: Path
) -> None:
    """issue 41: a `train` that failed before writing anything (bad store, model, option)
    left the empty run dir (and the parents) it had made."""
    store, args = FAILURES[failure]
    out = tmp_path / "runs" / "new" / "run"
    code, line = run_train(entry, str(tmp_path / store) if store else tiny_store, out, *args)
    assert code == 2 and line
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "mine"
    existing.mkdir()  # a run dir the user made stays
    assert run_train(entry, str(tmp_path / store) if store else tiny_store, existing, *args)[0]
    assert existing.is_dir()
