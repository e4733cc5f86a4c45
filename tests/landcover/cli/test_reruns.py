"""Every command that reruns into its own earlier output (train --resume, also with local
workers and as a cluster launch; tile; tune; scale) refuses a rerun that changes an option the
output must keep: one line naming the option, the recorded and the new value, and the fix;
exit 2; the output untouched; no worker started. Which options each command keeps or lets
change is tested over every option in the tests of its package
(tests/landcover/training/test_resume.py, tests/tiling/chipstore/test_resume.py,
tests/landcover/tuning/test_studydir.py, tests/landcover/scaling/test_sweep.py); a predict
rerun never reuses a part of other options (tests/landcover/prediction/test_distributed.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.scaling import sweep
from landcover.training import TrainConfig
from landcover.training.resume import FIX
from tests.conftest import REPO_ROOT
from tests.landcover.tuning.stand_in_worker import replace_trainer
from tests.support.sweeps import FakeLaunch
from tests.support.trainruns import write_saved_run
from tiling.synthetic.scenes import SynthResult

# (the rerun's arguments, the one line it must print); run in tmp_path
Rerun = tuple[list[str], str]


def train_rerun(store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch) -> Rerun:
    run = tmp / "run"
    last = write_saved_run(store, run, TrainConfig(store, str(run), batch_size=8))
    args = ["train", store, "--out", str(run), "--resume", "--batch-size", "8", "--seed", "1",
            "--device", "cpu", "--threads", "1"]  # fmt: skip
    return args, (
        f"{last}: checkpoint was trained with --seed 0, not --seed 1; a resumed run must keep "
        f"it: pass --seed 0, or {FIX}"
    )


def train_nproc_rerun(store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch) -> Rerun:
    """Refused by the parent, before any worker starts (`preflight.check_local_training`)."""
    args, line = train_rerun(store, scenes, tmp, mp)
    return [*args, "--nproc", "2"], line


def cluster_launch_rerun(
    store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch
) -> Rerun:
    """The repo's cluster.json (local engine, 2 nodes): refused by the launcher's parent."""
    train_args, line = train_rerun(store, scenes, tmp, mp)
    return ["cluster", "launch", str(REPO_ROOT / "cluster.json"), "--", *train_args], line


def tile_rerun(store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch) -> Rerun:
    out = tmp / "chips.zarr"
    labels = [a for p in scenes.label_paths for a in ("--labels", str(p))]
    args = ["tile", *map(str, scenes.image_paths), *labels, "--out", str(out),
            "--chip-size", "64", "--workers", "1"]  # fmt: skip
    done = CliRunner().invoke(main, [*args, "--shard-size", "16"])
    assert done.exit_code == 0, done.output
    return [*args, "--shard-size", "8"], (
        f"{out} exists and was written with other options (shard_size 16 (now 8)); rerun the "
        "original command to resume it, or pass --overwrite to replace it, or choose another "
        "--out"
    )


def tune_rerun(store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch) -> Rerun:
    replace_trainer(mp)
    out = tmp / "tune"
    args = ["tune", store, "--trials", "1", "--space", "lr=1e-4:1e-2:log", "--out", str(out)]
    train_args = ["--", "--batch-size", "8", "--threads", "1"]
    done = CliRunner().invoke(main, [*args, "--epochs", "1", *train_args])
    assert done.exit_code == 0, done.output
    return [*args, "--epochs", "2", *train_args], (
        f"{out} holds a search with other settings (--epochs 1 (now 2)); pass --overwrite to "
        "replace it or choose another --out"
    )


def scale_rerun(store: str, scenes: SynthResult, tmp: Path, mp: pytest.MonkeyPatch) -> Rerun:
    mp.setattr(sweep, "launch_plan", FakeLaunch())
    out = tmp / "sweep"
    args = ["scale", store, "--workers", "1", "--out", str(out)]
    train_args = ["--", "--batch-size", "8"]
    done = CliRunner().invoke(main, [*args, "--epochs", "2", *train_args])
    assert done.exit_code == 0, done.output
    return [*args, "--epochs", "3", *train_args], (
        f"{out} holds a sweep with other settings (--epochs 2 (now 3)); pass --overwrite to "
        "replace it or choose another --out"
    )


RERUNS: dict[str, Callable[[str, SynthResult, Path, pytest.MonkeyPatch], Rerun]] = {
    "train": train_rerun,
    "train --nproc": train_nproc_rerun,
    "cluster launch": cluster_launch_rerun,
    "tile": tile_rerun,
    "tune": tune_rerun,
    "scale": scale_rerun,
}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (the lock file of a search aside: it is opened, not written)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".tune.lock"
    }


@pytest.mark.parametrize("command", list(RERUNS))
def test_a_rerun_that_changes_an_option_the_output_keeps_is_one_line(
    command: str,
    tiny_store: str,
    tiny_scenes: SynthResult,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args, line = RERUNS[command](tiny_store, tiny_scenes, work, monkeypatch)
    before = snapshot(work)
    real_popen = subprocess.Popen

    def popen(command: Any, *args: Any, **kwargs: Any) -> Any:
        # only torchrun agents count: importing torch itself runs `ldconfig -p`
        if "torch.distributed.run" in map(str, command):
            raise AssertionError(f"a worker was started: {command}")
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr("cluster.local.agents.subprocess.Popen", popen)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {line}"]
    assert snapshot(work) == before
