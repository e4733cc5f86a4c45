"""A rerun of `landcover tune` into a search directory resumes its study: what it may change
(the trial budget) and what it must keep, each TuneConfig field and each training option,
refused in one line naming the setting and both values. The trainer is the stand-in's."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from cluster.spec import local_spec
from landcover.cliconfig import OptionSpec
from landcover.errors import TuneError
from landcover.training import TrainConfig
from landcover.training.config import OPTIONS
from landcover.tuning.space import NOT_TUNABLE, parse_space
from landcover.tuning.study import (
    STUDY_MAY_CHANGE,
    STUDY_MUST_MATCH,
    TuneConfig,
    run_study,
    tune_training,
)
from landcover.tuning.studydir import setting_changes
from tests.landcover.training.option_values import other_value
from tests.landcover.tuning.stand_in_worker import replace_trainer
from tiling.synthetic.scenes import SynthResult
from tiling.tiler.tile import TileConfig, tile

SPACE = "lr=1e-4:1e-2:log"
REFUSED = "pass --overwrite to replace it or choose another --out"


def tune_config(at: str, into: Path, **changes: Any) -> TuneConfig:
    """One trial of one epoch on store `at` into search dir `into`, with `changes`."""
    values: dict[str, Any] = {
        "store": at, "space": parse_space(SPACE), "trials": 1, "epochs": 1,
        "out_dir": str(into), "extra_args": ("--batch-size", "8", "--threads", "1"),
    }  # fmt: skip
    return TuneConfig(**{**values, **changes})


def test_every_tune_option_is_one_a_rerun_may_change_or_one_it_must_keep() -> None:
    """A new TuneConfig field fails here until it is put in one of the two."""
    names = sorted(f.name for f in fields(TuneConfig))
    assert sorted(STUDY_MAY_CHANGE + STUDY_MUST_MATCH) == names


# Each TuneConfig field changed on a rerun, and what the refusal says (None: the rerun resumes).
# `moved` is the search dir copied elsewhere, `copy` the same chips under another URL.
def tune_changes(store: str, out: Path) -> dict[str, tuple[dict[str, Any], str | None]]:
    moved, copy = out.parent / "moved", out.parent / "copy.zarr"
    return {
        "store": ({"store": str(copy)}, f"STORE {store} (now {copy})"),
        "space": (
            {"space": parse_space("lr=1e-3:1e-2")},
            f"--space {parse_space(SPACE)} (now lr=0.001:0.01)",
        ),
        "trials": ({"trials": 2}, None),
        "epochs": ({"epochs": 2}, "--epochs 1 (now 2)"),
        "out_dir": ({"out_dir": str(moved)}, None),
        "seed": ({"seed": 3}, "--seed 0 (now 3)"),
        "extra_args": ({"extra_args": ("--batch-size", "4")}, "--batch-size 8 (now 4)"),
        "cluster": ({"cluster": local_spec(1)}, "--cluster-json cluster None (now local)"),
        "entry_module": ({"entry_module": "stand.in"}, "--entry-module landcover.training"),
        "overwrite": ({"overwrite": True}, None),
    }


@pytest.mark.parametrize("name", [f.name for f in fields(TuneConfig)])
def test_a_rerun_refuses_or_takes_each_changed_tune_option(
    name: str, tiny_store: str, tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    out = tmp_path / "tune"
    run_study(tune_config(tiny_store, out))
    changes = tune_changes(tiny_store, out)
    assert name in changes, f"say what a rerun with another {name} does"
    change, words = changes[name]
    if "out_dir" in change:
        shutil.copytree(out, change["out_dir"])
    if "store" in change:
        shutil.copytree(tiny_store, change["store"])
    rerun = tune_config(tiny_store, out, **change)
    if words is None:
        assert name in STUDY_MAY_CHANGE
        result = run_study(rerun)
        assert len(result.rows) == rerun.trials
        return
    assert name in STUDY_MUST_MATCH
    with pytest.raises(TuneError) as info:
        run_study(rerun)
    message = str(info.value)
    assert message.startswith(f"{out} holds a search with other settings ({words}")
    assert message.endswith(REFUSED) and "\n" not in message


# The training options of a trial, each one a study records (the others are NOT_TUNABLE:
# TuneConfig's own fields, or credentials that may change).
TRIAL_OPTIONS = [option for option in OPTIONS if option.name not in NOT_TUNABLE]


@pytest.fixture(scope="module")
def searched(
    tiny_store: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], TuneConfig]:
    """`--space` text -> the config of a search of one trial run once per module (the stand-in
    trainer; a stand-in entry module, so the options reach the settings unchecked by the
    machine: a cuda device, pretrained weights, as for trials on a cluster)."""
    done: dict[str, TuneConfig] = {}

    def search(space: str) -> TuneConfig:
        if space not in done:
            out = tmp_path_factory.mktemp("search") / "tune"
            config = tune_config(tiny_store, out, entry_module="stand.in", space=parse_space(space))
            with pytest.MonkeyPatch.context() as monkeypatch:
                replace_trainer(monkeypatch)
                run_study(config)
            done[space] = config
        return done[space]

    return search


@pytest.mark.parametrize("option", TRIAL_OPTIONS, ids=lambda option: option.name)
def test_a_rerun_refuses_each_changed_training_option(
    option: OptionSpec, searched: Callable[[str], TuneConfig], tmp_path: Path
) -> None:
    # a searched option cannot be given after `--`
    done = searched("weight_decay=1e-5:1e-3" if option.name == "lr" else SPACE)
    out = tmp_path / "tune"
    shutil.copytree(done.out_dir, out)
    training, _ = tune_training(done)
    then = getattr(training, option.name)
    changed = replace(training, **{option.name: other_value(option, then)})
    # the training arguments after `--`: without --epochs and --seed, which tune sets
    defaults = {o.name: o.default for o in OPTIONS if o.name in ("epochs", "seed")}
    argv = replace(changed, **defaults).to_argv(options_only=True)
    rerun = replace(done, out_dir=str(out), extra_args=tuple(argv))
    with pytest.raises(TuneError) as info:
        run_study(rerun)  # refused before any trial runs
    now = getattr(changed, option.name)
    assert str(info.value) == (
        f"{out} holds a search with other settings ({option.flag.name} {then} (now {now})); "
        f"{REFUSED}"
    )


def test_storage_options_may_change(
    tiny_store: str, tmp_path: Path, stand_in_trainer: list[TrainConfig]
) -> None:
    out = tmp_path / "tune"
    run_study(tune_config(tiny_store, out, entry_module="stand.in"))
    args = ("--batch-size", "8", "--threads", "1", "--storage-options", '{"account_key": "k2"}')
    result = run_study(tune_config(tiny_store, out, entry_module="stand.in", extra_args=args))
    assert len(result.rows) == 1


def test_a_store_tiled_again_under_the_same_url_is_another_search(
    tiny_store: str,
    tiny_scenes: SynthResult,
    tmp_path: Path,
    stand_in_trainer: list[TrainConfig],
) -> None:
    store = tmp_path / "chips.zarr"
    shutil.copytree(tiny_store, store)
    out = tmp_path / "tune"
    run_study(tune_config(str(store), out))
    retiled = TileConfig(
        images=tuple(str(p) for p in tiny_scenes.image_paths),
        labels=tuple(str(p) for p in tiny_scenes.label_paths),
        out=str(store),
        chip_size=64,
        val_fraction=0.5,
        workers=1,
        overwrite=True,
    )
    tile(retiled)
    with pytest.raises(TuneError, match=r"other settings \(STORE content \(digest\) [0-9a-f]{64} "):
        run_study(tune_config(str(store), out))


def test_an_older_study_without_a_setting_is_not_compared_on_it() -> None:
    old = {"space": SPACE, "training": {"loss": "ce"}}
    new = {"space": SPACE, "training": {"loss": "ce", "sync_bn": False}, "store_digest": "d"}
    assert setting_changes(old, new) == []
    assert setting_changes(old, {**new, "space": "lr=1:2"}) == [f"--space {SPACE} (now lr=1:2)"]
