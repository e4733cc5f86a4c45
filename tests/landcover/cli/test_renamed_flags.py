"""Flags renamed so that one name means one thing (`predict --block-px`, `train
--bmuf-block-steps`): the old spellings work for one release, with a warning."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.cli.predict import predict_command

PREDICT = ["model.pt", "scene.tif", "--out", "lc.tif"]


def test_predict_block_px_is_the_flag_and_block_size_a_deprecated_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    new = predict_command.make_context("predict", [*PREDICT, "--block-px", "64"])
    assert new.params["block_px"] == 64 and capsys.readouterr().err == ""
    old = predict_command.make_context("predict", [*PREDICT, "--block-size", "64"])
    assert old.params == new.params
    assert capsys.readouterr().err == "warning: --block-size is deprecated: use --block-px\n"
    default = predict_command.make_context("predict", [*PREDICT])
    assert default.params["block_px"] is None and "block_px_deprecated" not in default.params
    later = predict_command.make_context("predict", [*PREDICT, "--block-size", "64",
                                                     "--block-px", "32"])  # fmt: skip
    assert later.params["block_px"] == 32


def test_help_names_the_new_flags_only() -> None:
    predict = CliRunner().invoke(main, ["predict", "--help"]).output
    assert "--block-px auto|PX" in predict and "--block-size" not in predict


def test_a_bad_block_edge_names_the_new_flag() -> None:
    result = CliRunner().invoke(main, ["predict", *PREDICT, "--block-size", "8"])
    assert result.exit_code == 2
    assert result.stderr == (
        "warning: --block-size is deprecated: use --block-px\n"
        "error: --block-px 8 px: must be at least 16\n"  # checked by PredictConfig, first
    )
