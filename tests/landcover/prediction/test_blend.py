"""Blending of overlapping windows (landcover.prediction.blend): window starts, tapers, weights
that sum to one, and a blender that leaves constant logits constant across blocks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from landcover.prediction.blend import (
    LogitBlender,
    WindowLayout,
    argmax_classes,
    class_probabilities,
    taper_profile,
    window_starts,
)
from landcover.prediction.gridwindow import Window


def test_window_starts_cover_the_length_and_end_flush() -> None:
    assert window_starts(90, 32, 8) == (0, 24, 48, 58)
    assert window_starts(20, 32, 8) == (0,)  # smaller than a window: one, hanging over
    assert window_starts(32, 32, 8) == (0,)
    for length in range(33, 200, 7):
        starts = window_starts(length, 32, 8)
        assert starts[-1] + 32 == length
        assert all(b - a <= 24 for a, b in itertools.pairwise(starts))


def test_taper_ramps_are_complementary() -> None:
    profile = taper_profile(32, 8, taper_start=True, taper_end=True)
    assert profile.min() > 0
    np.testing.assert_allclose(profile[:8] + profile[-8:], 1.0, rtol=1e-6)
    assert (profile[8:24] == 1).all()
    untapered = taper_profile(32, 8, taper_start=False, taper_end=False)
    assert (untapered == 1).all()


@pytest.mark.parametrize(("height", "width"), [(75, 90), (20, 47), (96, 96)])
def test_blending_weights_sum_to_one_everywhere(height: int, width: int) -> None:
    layout = WindowLayout.over(height, width, size=32, overlap=8)
    total = np.zeros((height, width))
    for r in layout.row_starts:
        for c in layout.col_starts:
            w = layout.weight(r, c)
            total[r : r + 32, c : c + 32] += w[: height - r, : width - c]
    assert total.min() > 0.05  # every pixel has weight: edges facing the border are not tapered
    # Normalised blend weights: each window's share, summed over windows, is one everywhere.
    shares = np.zeros((height, width))
    for r in layout.row_starts:
        for c in layout.col_starts:
            w = layout.weight(r, c)[: height - r, : width - c]
            shares[r : r + 32, c : c + 32] += w / total[r : r + 32, c : c + 32]
    np.testing.assert_allclose(shares, 1.0, rtol=1e-6)
    # On the regular stride (before the flush last window) the raw weights already sum to one.
    regular = (len(layout.row_starts) - 1) * 24
    if regular > 32:
        np.testing.assert_allclose(total[8 : regular - 8, : 24 * 2], 1.0, rtol=1e-5)


def test_blender_of_constant_logits_is_constant_across_blocks() -> None:
    layout = WindowLayout.over(75, 90, size=32, overlap=8)
    value = torch.tensor([0.5, -1.0, 2.0]).view(3, 1, 1).expand(3, 32, 32)
    for row0, col0, h, w in [(0, 0, 40, 50), (40, 50, 35, 40), (13, 7, 29, 61)]:
        blender = LogitBlender(layout, 3, Window(row0, col0, h, w))
        for r in layout.rows_touching(row0, row0 + h):
            for c in layout.cols_touching(col0, col0 + w):
                blender.add(value, r, c)
        expected = np.broadcast_to(np.array([0.5, -1.0, 2.0]).reshape(3, 1, 1), (3, h, w))
        np.testing.assert_allclose(blender.blended().numpy(), expected, rtol=1e-6)


def test_argmax_classes_is_torchs_argmax_ties_and_nan_included() -> None:
    generator = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 3, (5, 40, 40), generator=generator).float()  # many ties
    ties[2, :5, :5] = float("nan")
    ties[0, :2, :2] = float("nan")  # the first NaN wins, as for torch
    ties[4, 10:20, 10:20] = float("nan")
    scores = [
        ties,
        torch.randn(7, 33, 17, generator=generator),
        torch.full((3, 4, 4), float("-inf")),
        torch.randn(1, 8, 8, generator=generator),
    ]
    for x in scores:
        got = argmax_classes(x)
        assert got.dtype == torch.uint8
        assert torch.equal(got, x.argmax(dim=0).to(torch.uint8))


@pytest.mark.parametrize(
    "scores",
    [
        pytest.param(torch.randint(0, 3, (5, 40, 40)).float(), id="ties"),
        pytest.param(torch.tensor([3e38, 3e38, -3e38]).view(3, 1, 1).repeat(1, 6, 5), id="sum-inf"),
        pytest.param(
            torch.tensor([float("-inf"), float("inf"), 1.0]).view(3, 1, 1).repeat(1, 4, 3),
            id="sum-nan-without-nan",
        ),
    ],
)
def test_argmax_classes_without_nan_is_torchs_argmax(scores: torch.Tensor) -> None:
    """Scores without NaN take the fast path (or, where their sum is NaN, the NaN one)."""
    assert torch.equal(argmax_classes(scores), scores.argmax(dim=0).to(torch.uint8))


def test_blended_divides_once_and_the_blender_is_done() -> None:
    """Each window adds its weighted logits with one rounding (a fused multiply-add); the
    sums are those of every blender over the same windows, with or without the weights."""
    layout = WindowLayout.over(40, 40, size=32, overlap=8)
    generator = torch.Generator().manual_seed(1)
    blender = LogitBlender(layout, 3, Window(0, 0, 40, 40))
    sums_only = LogitBlender(layout, 3, Window(0, 0, 40, 40), mean=False)
    expected_total = torch.zeros(3, 40, 40)
    expected_weight = torch.zeros(40, 40)
    for r in layout.row_starts:
        for c in layout.col_starts:
            logits = torch.randn(3, 32, 32, generator=generator)
            weight = torch.from_numpy(np.array(layout.weight(r, c)))
            blender.add(logits, r, c)
            sums_only.add(logits, r, c)
            expected_total[:, r : r + 32, c : c + 32].addcmul_(logits, weight)
            expected_weight[r : r + 32, c : c + 32] += weight
    assert torch.equal(blender.sums(first=1), expected_total[1:])
    assert torch.equal(sums_only.sums(first=1), expected_total[1:])
    expected = expected_total[1:] / expected_weight.clamp_min(1e-12)
    assert torch.equal(blender.blended(first=1), expected)
    with pytest.raises(RuntimeError, match="blended"):
        blender.blended(first=1)
    with pytest.raises(RuntimeError, match="blended"):
        blender.add(torch.zeros(3, 32, 32), 0, 0)
    with pytest.raises(RuntimeError, match="blended"):
        blender.sums()
    with pytest.raises(RuntimeError, match="without weights"):
        sums_only.blended()


def test_class_probabilities_are_the_softmax_with_the_same_bits_at_any_thread_count() -> None:
    """Each pixel's probabilities are worked out alone: torch shares an odd-sized block's
    planes out among 1, 2, 3 or 5 threads at other places, and no bit changes."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 203, 181, generator=generator) * 6
    scores[:, 0, :4] = torch.tensor([30.0, 30.0, -30.0, 0.0]).view(4, 1)  # ties, extremes
    before = torch.get_num_threads()
    got = {}
    try:
        for threads in (1, 2, 3, 5):
            torch.set_num_threads(threads)
            got[threads] = class_probabilities(scores)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(p, got[1]) for p in got.values())
    torch.testing.assert_close(got[1], torch.softmax(scores, dim=0), rtol=1e-6, atol=1e-7)
    assert got[1][0, 0, 0] == got[1][1, 0, 0] == 0.5 and got[1][2, 0, 0] < 1e-20
