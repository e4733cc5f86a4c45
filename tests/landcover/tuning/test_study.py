"""The study: real trials on the tiny store (they run, resume, are pruned), and its bookkeeping
(refusals, interrupted trials, the lock, optuna missing) with the trainer replaced by the
stand-in's metrics, which take milliseconds."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from landcover.errors import LandcoverError, TuneError
from landcover.training import TrainCallbacks, TrainConfig
from landcover.tuning.space import parse_space
from landcover.tuning.study import TuneConfig, require_optuna, run_study
from landcover.tuning.studydir import STUDY_FILE
from tests.conftest import REPO_ROOT
from tests.landcover.tuning.stand_in_worker import val_miou, write_metrics

SAS_SIG = "c2lnbmF0dXJlLW9mLXRoZS1zYXMtdG9rZW4"
SPACE = parse_space("lr=1e-4:1e-2:log,loss=ce|ce+dice,model=small_unet")


def tune_config(store: str, out: Path, **changes: Any) -> TuneConfig:
    values: dict[str, Any] = {
        "store": store, "space": SPACE, "trials": 2, "epochs": 1, "out_dir": str(out),
        "extra_args": ("--batch-size", "8", "--threads", "1"),
    }  # fmt: skip
    return TuneConfig(**{**values, **changes})


class AlwaysPrune(optuna.pruners.BasePruner):
    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return True


@pytest.mark.slow
def test_trials_are_training_runs_and_a_rerun_resumes(tiny_store: str, tmp_path: Path) -> None:
    out = tmp_path / "tune"
    first = run_study(tune_config(tiny_store, out))
    assert first.ran == 2
    assert [(r.number, r.state, r.epochs) for r in first.rows] == [
        (0, "complete", 1),
        (1, "complete", 1),
    ]
    for row in first.rows:
        run = out / row.run_dir
        assert {"model.pt", "metrics.jsonl", "run.json"} <= {p.name for p in run.iterdir()}
        config = json.loads((run / "run.json").read_text())["config"]
        assert {k: config[k] for k in row.params} == row.params
        assert (config["epochs"], config["batch_size"]) == (1, 8)
    assert first.rows[0].params != first.rows[1].params
    assert first.best is not None and first.best.best_val_miou is not None
    before = {r.run_dir: (out / r.run_dir / "model.pt").stat().st_mtime_ns for r in first.rows}

    second = run_study(tune_config(tiny_store, out, trials=3))
    assert second.ran == 1
    assert [r.state for r in second.rows] == ["complete"] * 3
    assert second.rows[:2] == first.rows
    assert {d: (out / d / "model.pt").stat().st_mtime_ns for d in before} == before
    assert second.rows[2].params not in [r.params for r in first.rows]
    table = (out / "trials.md").read_text()
    assert "| 2 | lr=" in table and f"best: trial {second.best.number}" in table  # type: ignore[union-attr]
    assert (out / "trials.png").read_bytes().startswith(b"\x89PNG")

    third = run_study(tune_config(tiny_store, out, trials=3))
    assert third.ran == 0 and third.rows == second.rows


@pytest.mark.slow
def test_a_pruned_trial_stops_after_the_epoch_and_keeps_its_run(
    tiny_store: str, tmp_path: Path
) -> None:
    out = tmp_path / "tune"
    result = run_study(tune_config(tiny_store, out, trials=1, epochs=2), pruner=AlwaysPrune())
    (row,) = result.rows
    assert (row.state, row.epochs) == ("pruned", 1)
    assert result.best is None
    run = out / row.run_dir
    assert {"model.pt", "metrics.jsonl", "run.json", "checkpoints"} <= {
        p.name for p in run.iterdir()
    }
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1]
    assert "| 0 | lr=" in (out / "trials.md").read_text()


def test_scores_are_the_best_val_miou_of_each_run(
    tiny_store: str, tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    result = run_study(tune_config(tiny_store, tmp_path / "tune", epochs=3, seed=7))
    for row, config in zip(result.rows, stand_in_trainer, strict=True):
        assert row.best_val_miou == pytest.approx(val_miou(row.params["lr"], 3))
        assert (config.epochs, config.seed, config.lr) == (3, 7, row.params["lr"])
        assert config.out_dir == str(tmp_path / "tune" / row.run_dir)
    study = optuna.load_study(
        study_name="landcover-tune", storage=f"sqlite:///{tmp_path / 'tune' / STUDY_FILE}"
    )
    assert [sorted(t.intermediate_values) for t in study.trials] == [[1, 2, 3], [1, 2, 3]]


def test_the_median_pruner_waits_for_3_trials_and_the_second_epoch(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial 3 scores far below the others at every epoch: pruned after epoch 2, not 1."""
    calls: list[str] = []

    def train(config: TrainConfig, *, callbacks: TrainCallbacks) -> None:
        calls.append(config.out_dir)
        lr = 1e-12 if len(calls) == 4 else 1e-3
        write_metrics(Path(config.out_dir), lr=lr, epochs=config.epochs,
                      on_epoch_end=callbacks.on_epoch_end)  # fmt: skip

    monkeypatch.setattr("landcover.training.worker.train", train)
    result = run_study(tune_config(tiny_store, tmp_path / "tune", trials=4, epochs=4))
    assert [(r.state, r.epochs) for r in result.rows] == [("complete", 4)] * 3 + [("pruned", 2)]


def test_another_search_in_the_same_dir_is_refused_unless_overwrite(
    tiny_store: str, tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    out = tmp_path / "tune"
    run_study(tune_config(tiny_store, out, trials=1))
    other = parse_space("lr=1e-3:1e-2")
    with pytest.raises(TuneError) as info:
        run_study(tune_config(tiny_store, out, trials=1, space=other))
    assert str(info.value) == (
        f"{out} holds a search with other settings (--space {SPACE} (now lr=0.001:0.01)); "
        "pass --overwrite to replace it or choose another --out"
    )
    changes = r"\(--epochs 1 \(now 2\); --batch-size 8 \(now 16\); --threads 1 \(now None\)\)"
    with pytest.raises(TuneError, match=changes):
        run_study(tune_config(tiny_store, out, trials=1, epochs=2, extra_args=()))
    (out / "trial-000" / "keep").write_text("old")
    result = run_study(tune_config(tiny_store, out, trials=1, space=other, overwrite=True))
    assert [r.params.keys() for r in result.rows] == [{"lr": 0}.keys()]
    assert not (out / "trial-000" / "keep").exists()


def test_no_secret_is_kept_in_the_study(
    tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    key = "c2VjcmV0LWFjY291bnQta2V5LW9mLXRoZS10ZXN0"
    sas_store = f"https://acct.blob.core.windows.net/c/chips.zarr?sv=2022-11-02&sig={SAS_SIG}"
    options = ("--storage-options", json.dumps({"account_key": key}))
    out = tmp_path / "tune"
    # a stand-in entry module: the store is not opened before the (replaced) trainer runs
    config = tune_config(sas_store, out, trials=1, extra_args=options, entry_module="stand.in")
    run_study(config)
    assert stand_in_trainer[0].storage_options == {"account_key": key}
    assert stand_in_trainer[0].store_url == sas_store
    study = (out / STUDY_FILE).read_bytes()
    assert key.encode() not in study and SAS_SIG.encode() not in study
    assert b"acct.blob.core.windows.net" in study


def test_trial_dirs_without_a_study_are_refused(tiny_store: str, tmp_path: Path) -> None:
    out = tmp_path / "tune"
    (out / "trial-004").mkdir(parents=True)
    with pytest.raises(TuneError, match=r"holds trial-004 but no study\.db; pass --overwrite"):
        run_study(tune_config(tiny_store, out))


def test_an_interrupted_trial_is_run_again(
    tiny_store: str, tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    out = tmp_path / "tune"
    run_study(tune_config(tiny_store, out, trials=1))
    # what a kill during trial 1 leaves: a running trial with its params, a partial run dir
    study = optuna.load_study(study_name="landcover-tune", storage=f"sqlite:///{out / STUDY_FILE}")
    killed = study.ask()
    lr = killed.suggest_float("lr", 1e-4, 1e-2, log=True)
    killed.suggest_categorical("loss", ["ce", "ce+dice"])
    (out / "trial-001").mkdir()
    result = run_study(tune_config(tiny_store, out, trials=2))
    assert [r.state for r in result.rows] == ["complete", "fail", "complete"]
    assert result.ran == 1
    assert result.rows[1].params == {"lr": lr, "loss": killed.params["loss"]}
    assert result.rows[2].params == {**result.rows[1].params, "model": "small_unet"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_search_killed_during_a_trial_resumes(tiny_store: str, tmp_path: Path) -> None:
    """SIGKILL while trial 1 trains (after its first epoch): the rerun finds the study intact,
    marks trial 1 failed and trains its parameters again as trial 2."""
    out = tmp_path / "tune"
    config = tune_config(tiny_store, out, epochs=3)
    command = [
        sys.executable, "-m", "landcover.cli.app", "tune", tiny_store, "--trials", "2",
        "--epochs", "3", "--space", str(SPACE), "--out", str(out), "--", *config.extra_args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL) as search:
        started = time.monotonic()
        while not (out / "trial-001" / "metrics.jsonl").exists():
            assert search.poll() is None, "the search ended before it could be killed"
            assert time.monotonic() - started < 300, "trial 1 never finished an epoch"
            time.sleep(0.1)
        search.kill()
    result = run_study(config)
    assert [r.state for r in result.rows] == ["complete", "fail", "complete"]
    assert [r.epochs for r in result.rows[::2]] == [3, 3] and 1 <= result.rows[1].epochs < 3
    assert result.rows[2].params == result.rows[1].params
    assert result.ran == 1


def test_one_search_at_a_time(tiny_store: str, tmp_path: Path) -> None:
    out = tmp_path / "tune"
    out.mkdir()
    fd = os.open(out / ".tune.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(TuneError, match=f"another landcover tune is using {out}"):
            run_study(tune_config(tiny_store, out))
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("extra_args", "message"),
    [
        (("--epochs", "3"), "--epochs is set by landcover tune"),
        (("--out=x",), "--out is set by landcover tune"),
        (("--seed", "1"), "--seed is set by landcover tune"),
        (("--nproc", "2"), "--nproc is set by landcover tune"),
        (("--resume",), "--resume is set by landcover tune"),
        (("--lr", "0.1"), "--lr is searched by --space; remove it from the training arguments"),
        (("--bogus",), "training arguments: No such option '--bogus'"),
    ],
)
def test_training_arguments_the_search_sets_are_refused(
    tiny_store: str, tmp_path: Path, extra_args: tuple[str, ...], message: str
) -> None:
    with pytest.raises(LandcoverError, match=re.escape(message)):
        run_study(tune_config(tiny_store, tmp_path / "tune", extra_args=extra_args))
    assert not (tmp_path / "tune").exists()


def test_without_optuna_one_line_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(TuneError) as info:
        require_optuna()
    assert str(info.value) == (
        "landcover tune needs optuna, which is not installed: pip install 'landcover[tune]'"
    )
