"""TrainConfig: the one definition of the training options, its checks, and its argv."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from landcover.cli.app import main
from landcover.comm.spec import CompressionMode, CompressionSpec
from landcover.errors import TrainingError
from landcover.training.config import (
    OPTIONS,
    ClassWeights,
    Device,
    Loss,
    LrScaling,
    Optimizer,
    TrainConfig,
    parse_training,
    train_parser,
)
from tests.conftest import REPO_ROOT

_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
_POSITIVE = st.floats(min_value=0, exclude_min=True, allow_nan=False)
_NON_NEGATIVE = st.floats(min_value=0, allow_nan=False)


@st.composite
def configs(draw: st.DrawFn) -> TrainConfig:
    """Any valid TrainConfig, storage options included."""
    values: dict[str, Any] = {
        "store_url": draw(_TEXT.filter(lambda s: s and not s.startswith("-"))),
        "out_dir": draw(_TEXT),
        "model": draw(_TEXT),
        "pretrained": draw(st.sampled_from([None, "imagenet"])),
        "epochs": draw(st.integers(1, 10**6)),
        "batch_size": draw(st.integers(1, 4096)),
        "lr": draw(st.none() | _POSITIVE),
        "lr_scaling": draw(st.sampled_from(get_args(LrScaling))),
        "warmup_epochs": draw(_NON_NEGATIVE),
        "weight_decay": draw(_NON_NEGATIVE),
        "optimizer": draw(st.sampled_from(get_args(Optimizer))),
        "loss": draw(st.sampled_from(get_args(Loss))),
        "class_weights": draw(st.sampled_from(get_args(ClassWeights))),
        "seed": draw(st.integers(-(2**31), 2**31)),
        "patience": draw(st.none() | st.integers(1, 100)),
        "device": draw(st.sampled_from(get_args(Device))),
        "amp": draw(st.sampled_from([None, True, False])),
        "threads": draw(st.none() | st.integers(1, 256)),
        "storage_options": draw(st.dictionaries(_TEXT, _TEXT, max_size=2)),
        "compression": draw(st.sampled_from(["none", "fp16", "bf16", "powersgd:4", "onebit"])),
        "block_size": draw(st.integers(1, 64)),
        "block_momentum_value": draw(
            st.none() | st.floats(min_value=0, max_value=1, exclude_max=True)
        ),
        "block_lr": draw(_POSITIVE),
    }
    for name in ("augment", "resume", "overwrite", "block_momentum", "nesterov",
                 "reset_local_momentum", "allow_incomplete", "sync_bn"):  # fmt: skip
        values[name] = draw(st.booleans())
    try:
        return TrainConfig(**values)
    except TrainingError:  # a combination the checks refuse (e.g. --resume --overwrite)
        assume(False)
        raise


@settings(max_examples=300, deadline=None)
@given(config=configs())
def test_argv_round_trips_every_config(config: TrainConfig) -> None:
    """config -> to_argv -> from_argv gives it back; the storage options are never in it (they
    reach a worker through its environment)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("LANDCOVER_STORAGE_OPTIONS", raising=False)
        argv = config.to_argv()
        assert TrainConfig.from_argv(argv) == replace(config, storage_options={})
        options = config.to_argv(options_only=True)
        assert argv == [config.store_url, "--out", config.out_dir, *options]


def test_argv_holds_only_what_differs_from_the_defaults() -> None:
    assert TrainConfig("s", "r").to_argv() == ["s", "--out", "r"]
    config = TrainConfig(
        "s", "r", epochs=3, augment=False, amp=True, lr=0.01, storage_options={"a": "b"}
    )
    assert config.to_argv() == ["s", "--out", "r", "--epochs", "3", "--lr", "0.01",
                                "--no-augment", "--amp"]  # fmt: skip


def test_worker_options_round_trip_through_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LANDCOVER_STORAGE_OPTIONS", raising=False)
    args = ["s.zarr", "--out", "r", "--epochs", "3", "--no-augment", "--amp", "--resume",
            "--storage-options", '{"account_name": "x"}', "--compression", "powersgd:4",
            "--bmuf-block-steps", "5", "--no-nesterov", "--keep-local-momentum", "--patience", "2",
            "--lr", "0.01", "--sync-bn"]  # fmt: skip
    parsed = TrainConfig.from_argv(args)
    assert parsed.storage_options == {"account_name": "x"} and parsed.amp is True
    assert parsed.augment is False and parsed.nesterov is False
    assert parsed.reset_local_momentum is False and parsed.sync_bn is True
    assert TrainConfig.from_argv(parsed.to_argv()) == replace(parsed, storage_options={})
    # the workers read the storage options from their environment
    monkeypatch.setenv("LANDCOVER_STORAGE_OPTIONS", '{"account_name": "x"}')
    assert TrainConfig.from_argv(parsed.to_argv()) == parsed


def test_choices_are_the_literal_types() -> None:
    choices = {o.name: o.choices for o in OPTIONS if o.choices is not None}
    assert choices == {  # --pretrained is free text: imagenet or a weights file's path
        "lr_scaling": get_args(LrScaling),
        "optimizer": get_args(Optimizer),
        "loss": get_args(Loss),
        "class_weights": get_args(ClassWeights),
        "device": get_args(Device),
    }
    assert [o.name for o in OPTIONS] == [f.name for f in fields(TrainConfig)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "notanint"],
         "training arguments: Invalid value for '--epochs': 'notanint' is not a valid integer."),
        (["--epochs", "0"], "--epochs 0 must be >= 1"),
        (["--block-momentum-value", "1"], "--block-momentum-value 1.0 must be in [0, 1)"),
        (["--brightness-jitter", "1"], "--brightness-jitter 1.0 must be in [0, 1)"),
        (["--optimizer", "adam"],
         "training arguments: Invalid value for '--optimizer': 'adam' is not one of "
         "'adamw', 'sgd'."),
        (["--compresion", "fp16"],
         "training arguments: No such option '--compresion'. Did you mean '--compression'?"),
        (["--resume", "--overwrite"], "--resume and --overwrite exclude each other; pick one"),
        (["--block-momentum", "--sync-bn"],
         "--sync-bn all-reduces BatchNorm statistics in every step, which --block-momentum's "
         "local steps avoid (BMUF averages them at block ends); use one of them"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line(args: list[str], message: str) -> None:
    with pytest.raises(TrainingError) as info:
        TrainConfig.from_argv(["s", "--out", "r", *args])
    assert str(info.value) == message


def test_bad_values_of_the_api_name_the_option() -> None:
    with pytest.raises(TrainingError, match=r"^--optimizer 'adam': use one of \('adamw', 'sgd'\)$"):
        TrainConfig("s", "r", optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(
        TrainingError,
        match=r"^--pretrained 'x' is not known; give imagenet or the path of an encoder "
        r"weights file \(\.pth, .*\), or leave out --pretrained$",
    ):
        TrainConfig("s", "r", pretrained="x")
    assert TrainConfig("s", "r", pretrained="weights/encoder.pth").pretrained == (
        "weights/encoder.pth"
    )


def test_a_stand_in_entry_module_keeps_its_own_arguments() -> None:
    parsed = parse_training(["s", "--out", "r", "--die-at-epoch", "1", "--epochs", "2"],
                            strict=False)  # fmt: skip
    assert (parsed.config.epochs, parsed.extra_args) == (2, ("--die-at-epoch", "1"))
    with pytest.raises(TrainingError, match="No such option"):
        parse_training(["s", "--out", "r", "--die-at-epoch", "1"], strict=True)


def test_json_redacts_secret_storage_options() -> None:
    config = TrainConfig(
        "s",
        "r",
        storage_options={"account_name": "acct", "account_key": "k3y", "token": "t0k"},
    )
    assert config.to_json()["storage_options"] == {
        "account_name": "acct",
        "account_key": "<redacted>",
        "token": "<redacted>",
    }


def test_the_config_module_does_not_import_torch() -> None:
    code = "import sys, landcover.training.config; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_values_given_apart_from_the_argv() -> None:
    parsed = parse_training(
        ["s", "--sleep-s", "0.2"], strict=False, defaults={"out_dir": "r", "epochs": 2}
    )
    config = parsed.config
    assert (config.store_url, config.out_dir, config.epochs, parsed.extra_args) == (
        "s", "r", 2, ("--sleep-s", "0.2"),
    )  # fmt: skip
    assert parsed.given == {"store_url"}  # the defaults are not given by the arguments


@pytest.mark.parametrize(
    ("args", "given"),
    [
        (["--out", "r"], {"out_dir"}),
        (["--out=r", "--no-augment"], {"out_dir", "augment"}),
        (["--block-size", "4"], {"block_size"}),  # the deprecated spelling of the option
        (["--nproc", "2"], {"nproc"}),
        (["--model", "--out"], {"model"}),  # a value, though it looks like a flag
    ],
)
def test_the_parameters_the_arguments_set(args: list[str], given: set[str]) -> None:
    """What a launcher refuses (the options it sets itself) is found by parameter, whatever
    the spelling, never by looking at tokens."""
    parsed = parse_training(["s", *args], command=train_parser, defaults={"out_dir": "d"})
    assert parsed.given == {"store_url", *given}


# Every command that takes training options, as a command line ending in those options
TRAINING_COMMANDS: dict[str, Callable[[str, str], list[str]]] = {
    "train": lambda store, out: ["train", store, "--out", out],
    "cluster plan": lambda store, out: ["cluster", "plan", str(REPO_ROOT / "cluster.json"), "--",
                                        "train", store, "--out", out],
    "cluster launch": lambda store, out: ["cluster", "launch", str(REPO_ROOT / "cluster.json"),
                                          "--", "train", store, "--out", out],
    "scale": lambda store, out: ["scale", store, "--workers", "1", "--epochs", "1", "--out", out,
                                 "--"],
    "tune": lambda store, out: ["tune", store, "--trials", "1", "--epochs", "1", "--out", out,
                                "--space", "loss=ce|ce+dice", "--"],
}  # fmt: skip


@pytest.mark.parametrize("command", TRAINING_COMMANDS)
@pytest.mark.parametrize(
    ("option", "value"), [("--lr", "inf"), ("--warmup-epochs", "nan"), ("--block-lr", "-inf")]
)
def test_a_value_that_is_not_a_finite_number_is_refused_by_every_command(
    tmp_path: Path, command: str, option: str, value: str
) -> None:
    """inf passes `> 0` and would train on NaN losses from the first step."""
    out = tmp_path / "out"
    args = [*TRAINING_COMMANDS[command]("chips.zarr", str(out)), option, value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {option} {float(value)} must be a finite number\n"
    assert not out.exists()


@pytest.mark.parametrize("text", ["none", "NONE", " None "])
def test_block_momentum_takes_any_spelling_of_no_compression(text: str) -> None:
    """--compression is parsed once: `NONE` is none, which --block-momentum accepts."""
    config = TrainConfig.from_argv(["s", "--out", "r", "--compression", text, "--block-momentum"])
    assert config.block_momentum and not config.compression.compresses
    assert config.compression == CompressionSpec() and "--compression" not in config.to_argv()


def test_compression_travels_typed_and_writes_its_canonical_text() -> None:
    config = TrainConfig("s", "r", compression="PowerSGD")  # type: ignore[arg-type]
    assert config.compression == CompressionSpec(CompressionMode.POWERSGD, rank=2)
    assert config.to_json()["compression"] == "powersgd:2"
    assert config.to_argv(options_only=True) == ["--compression", "powersgd:2"]
    with pytest.raises(TrainingError, match=r"^--compression 'fp8' is not valid; use one of: "):
        TrainConfig.from_argv(["s", "--out", "r", "--compression", "fp8"])


def test_bmuf_block_steps_is_the_flag_and_block_size_a_deprecated_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = TrainConfig.from_argv(["s", "--out", "r", "--bmuf-block-steps", "5"])
    assert config.block_size == 5 and capsys.readouterr().err == ""
    assert config.to_argv(options_only=True) == ["--bmuf-block-steps", "5"]
    old = TrainConfig.from_argv(["s", "--out", "r", "--block-size", "5"])
    assert old == config
    assert capsys.readouterr().err == (
        "warning: --block-size is deprecated: use --bmuf-block-steps\n"
    )
    assert TrainConfig.from_argv(["s", "--out", "r"]).block_size == 8  # the alias no default
    result = CliRunner().invoke(main, ["train", "--help"])
    assert "--bmuf-block-steps INTEGER" in result.output and "--block-size" not in result.output


def _cluster_model(args: tuple[str, ...]) -> str:
    from landcover.cli.cluster import train_config

    return train_config(["train", "s", "--out", "r", *args])[0].model


def _sweep_model(args: tuple[str, ...]) -> str:
    from landcover.scaling.sweep import SweepConfig, sweep_training

    return sweep_training(SweepConfig("s", (1,), 1, "sweep", extra_args=args))[0].model


def _tune_model(args: tuple[str, ...]) -> str:
    from landcover.tuning.space import parse_space
    from landcover.tuning.study import TuneConfig, tune_training

    config = TuneConfig("s", parse_space("lr=1e-4:1e-2:log"), 1, 1, "tune", extra_args=args)
    return tune_training(config)[0].model


@pytest.mark.parametrize(
    ("launcher", "flag"),
    [
        (_cluster_model, "--nproc"),
        (_sweep_model, "--out"),
        (_sweep_model, "--epochs"),
        (_tune_model, "--epochs"),
        (_tune_model, "--seed"),
    ],
)
def test_a_launcher_takes_a_value_that_looks_like_an_option_it_sets_for_a_value(
    launcher: Callable[[tuple[str, ...]], str], flag: str
) -> None:
    """Training arguments are parsed, not scanned: `--model --out` names a model (the token
    scanners that `cluster launch -- train`, `scale` and `tune` had refused it as --out)."""
    assert launcher(("--model", flag)) == flag
