"""Test-time augmentation (landcover.prediction.tta, `predict --tta`): logits averaged over the
symmetries of the square, each pass mapped back before blending."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from landcover import cli
from landcover.errors import PredictionError
from landcover.models.registry import build_model
from landcover.prediction import prepared
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.tta import average_over_symmetries, tta_ops
from tests.landcover.prediction.inputs import read, write_model


@pytest.fixture(scope="module")
def constant_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "constant.pt", constant_class=2)


def _d4_mean_by_hand(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The mean over the 8 symmetries written with rot90 and transpose, not with the package's
    dihedral encoding: 4 rotations of x and 4 of its transpose, each pass turned back."""
    passes = []
    for image, transposed in ((x, False), (x.transpose(-2, -1), True)):
        for k in range(4):
            logits = torch.rot90(model(torch.rot90(image, k, dims=(-2, -1))), -k, dims=(-2, -1))
            passes.append(logits.transpose(-2, -1) if transposed else logits)
    return torch.stack(passes).mean(dim=0)


def test_average_is_the_mean_of_the_transformed_passes() -> None:
    torch.manual_seed(0)
    model = build_model("small_unet", in_channels=4, num_classes=5).eval()
    x = torch.randn(2, 4, 32, 32)
    with torch.no_grad():
        got = average_over_symmetries(model, x, tta_ops("d4"))
        assert torch.allclose(got, _d4_mean_by_hand(model, x), atol=1e-5)
        # An asymmetric model: TTA changes its logits, so the average is not a no-op.
        assert not torch.allclose(got, model(x), atol=1e-3)
        flips = [model(x), *(model(x.flip(d)).flip(d) for d in (-1, -2, (-2, -1)))]
        expected = torch.stack(flips).mean(dim=0)
        got = average_over_symmetries(model, x, tta_ops("flips"))
        assert torch.allclose(got, expected, atol=1e-5)
        # No TTA: the model's own logits, untouched.
        assert torch.equal(average_over_symmetries(model, x, tta_ops("none")), model(x))


def test_tta_of_a_constant_model_changes_nothing(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    outputs = {}
    for mode in ("none", "d4"):
        out, prob = tmp_path / f"{mode}.tif", tmp_path / f"{mode}-p.tif"
        config = PredictConfig(
            str(constant_model), (str(scene),), str(out), probabilities=str(prob), tta=mode
        )
        predict_region(config)
        outputs[mode] = (read(out)[0], read(prob)[0])
    assert (outputs["none"][0] == 2).all()
    np.testing.assert_array_equal(outputs["d4"][0], outputs["none"][0])
    np.testing.assert_array_equal(outputs["d4"][1], outputs["none"][1])


class _CountingModel:
    """Wraps the loaded model; counts the windows that go through it."""

    def __init__(self, model: Any) -> None:
        self.model, self.windows = model, 0

    def __call__(self, pixels: torch.Tensor) -> Any:
        self.windows += pixels.shape[0]
        return self.model(pixels)

    def __getattr__(self, name: str) -> Any:  # the rest of the backend model (what ran)
        return getattr(self.model, name)


def test_tta_costs_one_model_pass_per_symmetry(
    scene: Path, random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """d4 runs every window through the model 8 times, flips 4 times; the runtime is the same
    model's (the measured time ratio is in benchmarks/bench_tta.py)."""
    counters: list[_CountingModel] = []
    load = prepared.load_window_model

    def counting_load(*args: Any, **kwargs: Any) -> Any:
        model, meta = load(*args, **kwargs)
        counters.append(_CountingModel(model))
        return counters[-1], meta

    monkeypatch.setattr(prepared, "load_window_model", counting_load)
    results = {}
    for mode in ("none", "flips", "d4"):
        out = tmp_path / f"{mode}.tif"
        results[mode] = predict_region(
            PredictConfig(str(random_model), (str(scene),), str(out), tta=mode)
        )
    windows = [c.windows for c in counters]
    assert windows[0] == results["none"].windows > 0
    assert windows == [windows[0], 4 * windows[0], 8 * windows[0]]
    assert {r.windows for r in results.values()} == {windows[0]}


def test_cli_tta_flag_alone_means_d4(scene: Path, random_model: Path, tmp_path: Path) -> None:
    maps = {}
    for name, args in {"flag": ["--tta"], "d4": ["--tta", "d4"], "none": []}.items():
        out, prob = tmp_path / f"{name}.tif", tmp_path / f"{name}-p.tif"
        common = ["--out", str(out), "--probabilities", str(prob), "--device", "cpu"]
        result = CliRunner().invoke(
            cli.main, ["predict", str(random_model), str(scene), *common, *args]
        )
        assert result.exit_code == 0, result.output
        maps[name] = read(prob)[0]
    np.testing.assert_array_equal(maps["flag"], maps["d4"])
    assert not np.array_equal(maps["d4"], maps["none"])  # TTA reached the model


def test_unknown_tta_mode_is_refused(scene: Path, random_model: Path, tmp_path: Path) -> None:
    config = PredictConfig(str(random_model), (str(scene),), str(tmp_path / "o.tif"), tta="d8")
    with pytest.raises(PredictionError, match="--tta 'd8': choose one of none, flips, d4"):
        predict_region(config)
