"""What a resume may change and what it must keep: every TrainConfig option is one or the other,
and a resume that changes one it must keep is one line naming the option, both values and the
fix, before anything is loaded or written."""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from landcover import cli
from landcover.cliconfig import OptionSpec
from landcover.errors import TrainingError
from landcover.training import Checkpoint, TrainConfig, read_metrics, train
from landcover.training.checkpoint import save_checkpoint
from landcover.training.config import OPTIONS
from landcover.training.distributed import Collectives, DistEnv
from landcover.training.resume import (
    FIX,
    RESUME_MAY_CHANGE,
    RESUME_MUST_MATCH,
    check_resumable,
    resume_state,
)
from tests.landcover.training.option_values import other_value
from tests.support.trainruns import STORE, saved_checkpoint, write_saved_run

PATH = Path("run/checkpoints/last.pt")
BASE = TrainConfig(store_url="chips.zarr", out_dir="run", epochs=2, resume=True, device="cpu")


def test_every_option_is_one_a_resume_may_change_or_one_it_must_keep() -> None:
    """A new TrainConfig field fails here until it is put in one of the two."""
    names = sorted(f.name for f in fields(TrainConfig))
    assert sorted(RESUME_MUST_MATCH + RESUME_MAY_CHANGE) == names


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.name)
def test_a_resume_refuses_or_takes_each_changed_option(option: OptionSpec) -> None:
    saved = saved_checkpoint(BASE)
    value = other_value(option, getattr(BASE, option.name))
    changed = {**BASE.to_json(), option.name: value}
    if option.name in RESUME_MAY_CHANGE:
        check_resumable(PATH, saved, config=changed, store=STORE)
        return
    with pytest.raises(TrainingError) as info:
        check_resumable(PATH, saved, config=changed, store=STORE)
    message = str(info.value)
    assert message.startswith(f"{PATH}: checkpoint was trained with ") and "\n" not in message
    assert option.flag.name in message and message.endswith(FIX)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"batch_size": 4},
            "--batch-size 16, not --batch-size 4; a resumed run must keep it: pass --batch-size 16",
        ),
        (
            {"augment": False},
            "--augment, not --no-augment; a resumed run must keep it: pass --augment",
        ),
        (
            {"pretrained": "imagenet"},
            "--pretrained unset, not --pretrained imagenet; a resumed run must keep it: leave "
            "out --pretrained",
        ),
        (
            {"sync_bn": True},
            "no --sync-bn, not --sync-bn; a resumed run must keep it: leave out --sync-bn",
        ),
        # the optimizer's default lr, given or left out, is the same lr
        ({"lr": 0.02}, "--lr 0.002, not --lr 0.02; a resumed run must keep it: pass --lr 0.002"),
    ],
)
def test_a_refusal_names_the_option_both_values_and_the_fix(
    change: dict[str, Any], words: str
) -> None:
    saved = saved_checkpoint(BASE)
    with pytest.raises(TrainingError) as info:
        check_resumable(PATH, saved, config={**BASE.to_json(), **change}, store=STORE)
    assert str(info.value) == f"{PATH}: checkpoint was trained with {words}, or {FIX}"


def test_the_optimizers_default_lr_given_by_value_resumes() -> None:
    saved = saved_checkpoint(BASE)
    check_resumable(PATH, saved, config={**BASE.to_json(), "lr": 2e-3}, store=STORE)


def test_an_option_an_older_checkpoint_did_not_record_is_its_default() -> None:
    saved = saved_checkpoint(BASE)
    old = {k: v for k, v in saved.config.items() if k not in ("sync_bn", "class_weights")}
    older = Checkpoint.from_payload({**saved.to_payload(), "config": old})
    check_resumable(PATH, older, config=BASE.to_json(), store=STORE)


def test_a_checkpoint_from_before_brightness_jitter_trained_without_it() -> None:
    saved = saved_checkpoint(BASE)
    old = {k: v for k, v in saved.config.items() if k != "brightness_jitter"}
    older = Checkpoint.from_payload({**saved.to_payload(), "config": old})
    with pytest.raises(TrainingError, match=r"pass --brightness-jitter 0\.0, or"):
        check_resumable(PATH, older, config=BASE.to_json(), store=STORE)
    check_resumable(PATH, older, config={**BASE.to_json(), "brightness_jitter": 0.0}, store=STORE)


def test_epochs_may_grow_or_shrink_but_not_below_the_epochs_done() -> None:
    saved = saved_checkpoint(BASE, epoch=3)
    for epochs in (3, 5):
        check_resumable(PATH, saved, config={**BASE.to_json(), "epochs": epochs}, store=STORE)
    with pytest.raises(TrainingError) as info:
        check_resumable(PATH, saved, config={**BASE.to_json(), "epochs": 2}, store=STORE)
    assert str(info.value) == (
        f"{PATH}: checkpoint has 3 epochs done, more than --epochs 2; pass --epochs 3 or more "
        f"to resume it, or {FIX}"
    )


@pytest.mark.parametrize(("patience", "stopped"), [(2, True), (3, False), (None, False)])
def test_a_run_that_stopped_early_goes_on_when_the_new_patience_allows(
    run_dir: Path, patience: int | None, stopped: bool
) -> None:
    """Stopped after 2 epochs without a better val mIoU under --patience 2."""
    module = torch.nn.Linear(2, 2)
    saved = saved_checkpoint(
        BASE, epoch=3, model=module.state_dict(), epochs_without_improvement=2, stopped_early=True
    )
    save_checkpoint(run_dir, saved.to_payload())
    config = TrainConfig(
        store_url="chips.zarr", out_dir=str(run_dir), epochs=5, patience=patience, resume=True
    )
    comms = Collectives(DistEnv(), torch.device("cpu"))
    state = resume_state(run_dir / "checkpoints" / "last.pt", config, comms, module, store=STORE)
    assert (state.start_epoch, state.stopped_early) == (3, stopped)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--batch-size", "4"], "--batch-size 8, not --batch-size 4; a resumed run must keep "
         "it: pass --batch-size 8"),
        (["--no-augment"], "--augment, not --no-augment; a resumed run must keep it: pass "
         "--augment"),
        (["--seed", "1"], "--seed 0, not --seed 1; a resumed run must keep it: pass --seed 0"),
        (["--loss", "ce+dice"], "--loss ce, not --loss ce+dice; a resumed run must keep it: "
         "pass --loss ce"),
        (["--compression", "fp16"], "--compression none, not --compression fp16; a resumed "
         "run must keep it: pass --compression none"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else "",
)  # fmt: skip
def test_cli_refuses_a_changed_option_in_one_line_before_loading(
    tiny_store: str, run_dir: Path, args: list[str], words: str
) -> None:
    saved = TrainConfig(store_url=tiny_store, out_dir=str(run_dir), batch_size=8)
    last = write_saved_run(tiny_store, run_dir, saved)
    before = last.read_bytes()
    common = ["train", tiny_store, "--out", str(run_dir), "--resume", "--batch-size", "8",
              "--device", "cpu", "--threads", "1", "--tracking", "none"]  # fmt: skip
    result = CliRunner().invoke(cli.main, [*common, *args])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {last}: checkpoint was trained with {words}, or {FIX}"
    ]
    assert last.read_bytes() == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]


def test_cli_nproc_refuses_a_changed_option_before_starting_workers(
    tiny_store: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    last = write_saved_run(tiny_store, run_dir, TrainConfig(tiny_store, str(run_dir)))

    def launch_job(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("workers started")

    monkeypatch.setattr("landcover.cli.train.launch_job", launch_job)
    args = ["train", tiny_store, "--out", str(run_dir), "--resume", "--nproc", "2",
            "--batch-size", "8", "--weight-decay", "0.01"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {last}: checkpoint was trained with --batch-size 16, not --batch-size 8; a "
        f"resumed run must keep it: pass --batch-size 16, or {FIX}"
    ]


@pytest.mark.slow
def test_a_resume_uses_and_records_the_options_it_may_change(
    tiny_store: str, run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options: dict[str, Any] = {"batch_size": 8, "device": "cpu", "threads": 1, "tracking": "none"}
    train(TrainConfig(store_url=tiny_store, out_dir=str(run_dir), epochs=1, **options))
    resumed = TrainConfig(
        store_url=tiny_store, out_dir=str(run_dir), epochs=2, log_every=7, resume=True, **options
    )
    with caplog.at_level(logging.INFO, logger="landcover.training.resume"):
        result = train(resumed)
    assert result.epochs_completed == 2 and len(read_metrics(run_dir)) == 2
    last = run_dir / "checkpoints" / "last.pt"
    assert (
        f"{last}: resuming with --epochs 2 (was --epochs 1), --log-every 7 (was --log-every 50)"
        in caplog.messages
    )
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["config"]["epochs"], run["config"]["log_every"], run["resumed_from_epoch"]) == (
        2,
        7,
        1,
    )
    saved = torch.load(last, map_location="cpu", weights_only=True)["config"]
    assert (saved["epochs"], saved["log_every"]) == (2, 7)
