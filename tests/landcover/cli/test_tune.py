"""`landcover tune` through the CLI: the printed table and best trial, trials as cluster jobs on
the local engine (a stand-in worker), and one-line errors. The real trainer's trials are tested
in tests/landcover/tuning/test_study.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from landcover.training import TrainConfig
from tests.conftest import REPO_ROOT
from tests.landcover.tuning.stand_in_worker import ENTRY_MODULE, replace_trainer, val_miou
from tests.support.cli import invoke

SPACE = "lr=1e-4:1e-2:log,loss=ce|ce+dice"


def test_prints_the_table_and_the_best_trial(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replace_trainer(monkeypatch)
    out = tmp_path / "tune"
    args = ("tune", tiny_store, "--space", SPACE, "--epochs", "2", "--out", str(out))
    result = invoke(*args, "--trials", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "| trial | params | best val mIoU | epochs | state | run dir |"
    assert [line.split(" | ")[-1] for line in lines[2:4]] == ["trial-000 |", "trial-001 |"]
    best = re.fullmatch(r"best: trial (\d), val mIoU 0\.\d{4}: (.*)", lines[4])
    assert best is not None and best[2] == str(out / f"trial-00{best[1]}")
    assert lines[5] == f"table: {out / 'trials.md'}; plot: {out / 'trials.png'}"
    assert "trial 1: complete, val mIoU 0." in result.stderr

    resumed = invoke(*args, "--trials", "3")
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout.splitlines()[2:4] == lines[2:4]
    assert "trial 0:" not in resumed.stderr and "trial 2: complete" in resumed.stderr

    other = invoke(*args[:3], "lr=1e-3:1e-2", *args[4:], "--trials", "3")
    assert other.exit_code == 2
    assert other.stderr == (
        f"error: {out} holds a search with other settings (--space "
        "lr=0.0001:0.01:log,loss=ce|ce+dice (now lr=0.001:0.01)); pass --overwrite to replace it "
        "or choose another --out\n"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cluster_trials_are_jobs_scored_from_their_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchrun's worker finds the stand-in module from any working directory
    paths = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    spec = {"name": "one", "engine": "local", "vmSize": "local", "targetNodeCount": 1}
    (tmp_path / "cluster.json").write_text(json.dumps(spec))
    out = tmp_path / "tune"
    result = invoke(
        "tune", "chips.zarr", "--trials", "2", "--epochs", "3", "--space", "lr=1e-4:1e-2:log",
        "--out", str(out), "--cluster", str(tmp_path / "cluster.json"), "--seed", "3",
        "--entry-module", ENTRY_MODULE, "--", "--batch-size", "4",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="landcover-tune", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for trial in study.trials:
        lr = trial.params["lr"]
        assert trial.value == pytest.approx(val_miou(lr, 3))
        assert sorted(trial.intermediate_values) == [1, 2, 3]
        argv = json.loads((out / f"trial-{trial.number:03d}" / "argv.json").read_text())
        assert argv[:3] == ["chips.zarr", "--out", str(out / f"trial-{trial.number:03d}")]
        config = TrainConfig.from_argv(argv)
        assert (config.lr, config.epochs, config.seed, config.batch_size) == (lr, 3, 3, 4)
    assert "| 1 | lr=" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--space", "learning_rate=1:2"), "error: --space 'learning_rate=1:2': 'learning_rate' "
         "is not a tunable training option; use one of model, pretrained,"),
        (("--space", "loss=ce|focal"), "error: --space loss=ce|focal: --loss 'focal': use one "
         "of ('ce', 'ce+dice')"),
        (("--space", "lr=1e-3:1e-2", "--", "--lr", "0.1"), "error: --lr is searched by --space"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    base = ("tune", "chips.zarr", "--trials", "2", "--epochs", "1", "--out", str(tmp_path / "t"))
    result = invoke(*base, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_without_optuna_one_line_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    result = invoke(
        "tune", "chips.zarr", "--trials", "1", "--epochs", "1", "--space", SPACE,
        "--out", str(tmp_path / "t"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr == (
        "error: landcover tune needs optuna, which is not installed: "
        "pip install 'landcover[tune]'\n"
    )


def test_help_imports_neither_torch_nor_optuna() -> None:
    code = (
        "import sys; from click.testing import CliRunner; from landcover.cli.app import main; "
        "r = CliRunner().invoke(main, ['tune', '--help']); assert r.exit_code == 0, r.output; "
        "print('torch' in sys.modules, 'optuna' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


# Values the space allows that a trial would fail on: refused before the first trial
REFUSED_VALUES = [
    ("lr=1e-4:inf:log", "--space lr=0.0001:inf:log: --lr inf must be a finite number"),
    ("model=small_unet|nonexistent", "--space model=small_unet|nonexistent: unknown model "
     "'nonexistent'; choose one of: deeplabv3_resnet50, "),
    ("device=cpu|cuda", "--space device=cpu|cuda: --device cuda but no CUDA device is visible; "
     "use --device cpu"),
    ("batch_size=8:1000", "--space batch_size=8:1000: 69 train chips over 1 workers give 69 "
     "chips per worker, fewer than --batch-size 1000; use a smaller batch or fewer workers"),
    ("pretrained=none|imagenet", "--space pretrained=none|imagenet: small_unet has no "
     "pretrained weights; leave out --pretrained"),
    ("block_momentum=true|false,compression=none|fp16", "--space block_momentum=true|false,"
     "compression=none|fp16: block_momentum=true with compression=fp16: --compression fp16 "
     "compresses DDP gradients but --block-momentum averages models instead; use one of them"),
]  # fmt: skip


@pytest.mark.parametrize(("space", "message"), REFUSED_VALUES)
def test_every_value_of_the_space_is_checked_as_train_checks_it_before_any_trial(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, space: str, message: str
) -> None:
    trained = replace_trainer(monkeypatch)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "tune"
    result = invoke(
        "tune", tiny_store, "--trials", "2", "--epochs", "1", "--space", space, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1
    assert trained == [] and not out.exists()


def test_values_are_checked_for_the_workers_of_a_local_cluster(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = replace_trainer(monkeypatch)
    spec = {"name": "two", "engine": "local", "vmSize": "local", "targetNodeCount": 1,
            "processesPerNode": 2}  # fmt: skip
    (tmp_path / "cluster.json").write_text(json.dumps(spec))
    base = ("tune", tiny_store, "--trials", "1", "--epochs", "1", "--out", str(tmp_path / "t"),
            "--cluster", str(tmp_path / "cluster.json"), "--space")  # fmt: skip
    result = invoke(*base, "batch_size=8:48")
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: --space batch_size=8:48: 69 train chips over 2 workers give 34 chips per worker, "
        "fewer than --batch-size 48; use a smaller batch or fewer workers\n"
    )
    result = invoke(*base, "sync_bn=false|true", "--", "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --space sync_bn=false|true: --sync-bn needs CUDA")
    assert trained == [] and not (tmp_path / "t").exists()
