"""The run directory: refusing old results, atomic writes, metrics.jsonl, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from landcover.errors import TrainingError
from landcover.training.checkpoint import read_checkpoint, save_checkpoint
from landcover.training.rundir import (
    RUN_KEYS,
    append_metrics,
    check_run_dir,
    jsonable,
    prepare_run_dir,
    read_metrics,
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
    make_run(tmp_path / "again")
    (tmp_path / "again" / "checkpoints" / "last.pt").unlink()
    assert prepare_run_dir(tmp_path / "again", resume=True, overwrite=False) is None
    assert list((tmp_path / "again").iterdir()) == []  # nothing to resume: a fresh start


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
        f"{path}: checkpoint was trained with --batch-size 8, not 16; pass the same value or "
        "--overwrite"
    )
    torch.save({"epoch": 1}, path)
    with pytest.raises(TrainingError, match="not a landcover checkpoint; pass --overwrite"):
        read_checkpoint(path, must_match={})
    path.write_bytes(b"garbage")
    with pytest.raises(TrainingError, match=r"unreadable checkpoint .*; delete it or pass"):
        read_checkpoint(path, must_match={})


def test_jsonable_values() -> None:
    values = jsonable(
        {1: np.int64(2), "t": torch.tensor([1.5]), "nan": math.nan, "s": {3}, "p": Path("a")}
    )
    assert values == {"1": 2, "t": [1.5], "nan": None, "s": [3], "p": "a"}
