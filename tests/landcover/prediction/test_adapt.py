"""Test-time adaptation (landcover.prediction.adapt, .adaptspec): the `--adapt` values, the
statistics of a sample (exact numbers on tiny inputs and models), and what a prediction with
adaptation writes: its tags, the same bytes at any rank count and as tiles, and the same
classes from torch and onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from landcover.errors import PredictionError
from landcover.models.modelfile import ModelMeta
from landcover.prediction.adapt import (
    MIN_VALID_FRACTION,
    adapted_module,
    band_statistics,
    bn_statistics,
    compute_adaptation,
    sample_pixels,
    sample_windows,
)
from landcover.prediction.adaptspec import (
    DEFAULT_STRENGTHS,
    TAG_ADAPT,
    TAG_ADAPT_BANDS,
    TAG_ADAPT_SHA256,
    AdaptSpec,
    parse_adapt,
)
from landcover.prediction.outgrid import plan_output_grid
from landcover.prediction.setup import open_images
from tests.landcover.prediction.inputs import CLASS_MAP, pixels, write_image

# -- the --adapt values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "method", "strength", "canonical"),
    [
        ("none", "none", 0.0, "none"),
        ("bn", "bn", DEFAULT_STRENGTHS["bn"], f"bn:{DEFAULT_STRENGTHS['bn']:g}"),
        ("bn:0.25", "bn", 0.25, "bn:0.25"),
        ("bn-early", "bn-early", DEFAULT_STRENGTHS["bn-early"], "bn-early:1"),
        ("bands:1", "bands", 1.0, "bands:1"),
        ("bn+bands:0", "bn+bands", 0.0, "bn+bands:0"),
        ("bn:0.5@" + "ab" * 32, "bn", 0.5, "bn:0.5"),  # a recorded key: the digest is ignored
    ],
)
def test_adapt_values_parse_to_a_method_and_strength(
    text: str, method: str, strength: float, canonical: str
) -> None:
    spec = parse_adapt(text)
    assert (spec.method, spec.strength, str(spec)) == (method, strength, canonical)
    assert spec.active == (method != "none" and strength > 0)


@pytest.mark.parametrize("text", ["adabn", "bn:1.5", "bn:-0.1", "bn:x", "none:0.5", "bn:nan"])
def test_a_bad_adapt_value_is_one_line_naming_it(text: str) -> None:
    with pytest.raises(PredictionError) as caught:
        parse_adapt(text)
    message = str(caught.value)
    assert f"--adapt {text!r}" in message and "\n" not in message


# -- the sample and its statistics -------------------------------------------------------------


def test_the_sample_is_a_fixed_lattice_over_the_grid() -> None:
    windows = sample_windows(100, 40, 32)
    rows = sorted({w.row for w in windows})
    cols = sorted({w.col for w in windows})
    assert rows == [0, 14, 27, 41, 54, 68]  # 6 evenly spaced, the last one ends at 100
    assert cols == [0, 2, 3, 5, 6, 8]
    assert {(w.height, w.width) for w in windows} == {(32, 32)}
    assert len(sample_windows(20, 20, 32)) == 1  # a grid smaller than a window: one window


def test_band_statistics_are_the_mean_and_std_of_the_valid_pixels() -> None:
    pixels = np.zeros((2, 2, 2, 2), dtype=np.uint8)
    pixels[0, 0] = [[10, 20], [30, 99]]
    pixels[0, 1] = [[1, 1], [1, 99]]
    pixels[1, 0] = [[40, 99], [99, 99]]
    pixels[1, 1] = [[3, 99], [99, 99]]
    valid = np.array([[[True, True], [True, False]], [[True, False], [False, False]]])
    mean, std = band_statistics(pixels, valid)
    assert mean == (25.0, 1.5)  # 10, 20, 30, 40 and 1, 1, 1, 3
    assert std == pytest.approx((float(np.sqrt(125.0)), float(np.sqrt(0.75))), abs=0)


def _meta(mean: float = 110.0, std: float = 60.0, bands: int = 1) -> ModelMeta:
    return ModelMeta(
        architecture="small_unet",
        class_map=CLASS_MAP,
        band_names=("red", "green", "blue", "nir")[:bands],
        band_mean=(mean,) * bands,
        band_std=(std,) * bands,
        chip_size=2,
        resolution_m=1.0,
    )


def test_bands_mix_the_training_and_target_statistics() -> None:
    pixels = np.array([[[[50, 150]]], [[[50, 150]]]], dtype=np.uint8)  # mean 100, std 50
    valid = np.ones((2, 1, 2), dtype=bool)
    half = compute_adaptation(AdaptSpec("bands", 0.5), _meta(), pixels, valid)
    assert (half.band_mean, half.band_std) == ((105.0,), (55.0,))
    full = compute_adaptation(AdaptSpec("bands", 1.0), _meta(), pixels, valid)
    assert (full.band_mean, full.band_std, full.bn) == ((100.0,), (50.0,), ())
    assert full.digest != half.digest and len(full.digest) == 64
    assert full.key == f"bands:1@{full.digest}"
    tags = full.tags()
    assert tags[TAG_ADAPT] == "bands:1" and tags[TAG_ADAPT_SHA256] == full.digest
    assert json.loads(tags[TAG_ADAPT_BANDS]) == {"mean": [100.0], "std": [50.0]}


def _two_bn_model() -> nn.Sequential:
    """x -> conv (x2) -> BN1 -> conv (x1, +0) -> BN2: running stats mean 0, var 1."""
    conv = nn.Conv2d(1, 1, 1, bias=False)
    second = nn.Conv2d(1, 1, 1, bias=False)
    with torch.no_grad():
        conv.weight.fill_(2.0)
        second.weight.fill_(1.0)
    return nn.Sequential(conv, nn.BatchNorm2d(1), second, nn.BatchNorm2d(1)).eval()


def test_bn_statistics_adapt_each_layer_after_the_ones_before_it() -> None:
    model = _two_bn_model()
    x = torch.tensor([[[[1.0, 3.0]]], [[[5.0, 7.0]]]])  # BN1 sees 2x: mean 8, var 20
    stats = bn_statistics(model, x, strength=0.5)
    assert [name for name, _, _ in stats] == ["1", "3"]
    assert stats[0][1:] == ((4.0,), (10.5,))  # (0 + 8) / 2, (1 + 20) / 2
    # BN2 sees BN1's adapted output (2x - 4) / sqrt(10.5 + eps): mean 4 / s, var 20 / s^2
    s = float(np.sqrt(np.float32(10.5) + np.float32(1e-5)))
    assert stats[1][1] == pytest.approx((0.5 * 4.0 / s,), rel=1e-6)
    assert stats[1][2] == pytest.approx((0.5 + 0.5 * 20.0 / s**2,), rel=1e-6)
    first = bn_statistics(model, x, strength=0.5, first=1)
    assert first == stats[:1]
    assert float(dict(model.named_buffers())["1.running_mean"]) == 0.0  # model unchanged
    adapted = dict(adapted_module(model, stats).named_buffers())
    assert float(adapted["1.running_mean"]) == 4.0
    assert float(adapted["3.running_var"]) == stats[1][2][0]
    assert bn_statistics(model, x, strength=0.0)[0][1:] == ((0.0,), (1.0,))


def test_bn_statistics_are_the_same_bits_at_any_thread_count() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = torch.randn(5, 4, 24, 24)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(bn_statistics(model, x, strength=0.5))
    finally:
        torch.set_num_threads(before)
    assert runs[0] == runs[1]


def test_bn_on_a_model_without_batchnorm_is_refused_in_one_line() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.GroupNorm(1, 2)).eval()
    with pytest.raises(PredictionError, match=r"no BatchNorm layers.*--adapt bands or none"):
        bn_statistics(model, torch.ones(1, 1, 2, 2), strength=0.5)


def test_the_sample_leaves_out_windows_mostly_without_data(tmp_path: Path) -> None:
    data = pixels(90, 120, seed=3)
    data[:, :, :80] = 0  # two thirds of the image: no data (zero in every band)
    image = write_image(tmp_path / "collar.tif", data)
    plan = plan_output_grid(open_images([str(image)]), None, resolution_m=1.0)
    values, valid = sample_pixels(plan, 32)
    lattice = sample_windows(90, 120, 32)
    assert 0 < len(values) < len(lattice)
    assert values.shape[1:] == (4, 32, 32) and valid.shape[1:] == (32, 32)
    assert all(v.mean() >= MIN_VALID_FRACTION for v in valid)
    assert not values[~np.broadcast_to(valid[:, None], values.shape)].any()  # nodata is 0
