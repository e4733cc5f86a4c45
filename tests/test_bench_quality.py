"""The quality benchmark's own arithmetic (benchmarks/shifts.py, benchmarks/bench_quality.py),
without training (the benchmark trains for minutes: it is not a test): the radiometric shifts
of its cross-scene sets, the scene layout, the folds, pooled scoring, and the seed-by-seed
verdict that decides a default."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from landcover.evaluation import confusion_matrix

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import shifts  # type: ignore[import-not-found]
from bench_quality import (  # type: ignore[import-not-found]
    CANDIDATES,
    GAP_PX,
    REFERENCE,
    TILE_SHIFTED,
    WITHIN,
    WORLD,
    WORLD_SHIFTED,
    Candidate,
    Scene,
    decide,
    fold_split,
    held_out_scenes,
    pooled_columns,
    scores,
    verdict,
    with_predict_variants,
)


def scene(seed: int = 0) -> np.ndarray:
    """A 4 x 24 x 30 scene: a vegetated left half (NIR above red), a bare right half, and a
    nodata corner (0 in every band), with a few pixels at the ends of the range."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(20, 200, (4, 24, 30)).astype(np.uint8)
    pixels[shifts.NIR, :, :15] = rng.integers(150, 230, (24, 15))
    pixels[shifts.RED, :, :15] = rng.integers(30, 70, (24, 15))
    pixels[:, 0, 20] = 255
    pixels[:, 1, 20] = 1
    pixels[:, :5, :5] = 0
    return pixels


@pytest.mark.parametrize("shift", shifts.SHIFTS, ids=lambda s: s.name)
def test_every_shift_keeps_nodata_and_data_where_they_were(shift: shifts.Shift) -> None:
    pixels = scene()
    out = shift.apply(pixels)
    assert out.dtype == np.uint8 and out.shape == pixels.shape
    np.testing.assert_array_equal(shifts.data_mask(out), shifts.data_mask(pixels))
    assert (out[:, :5, :5] == 0).all()
    assert not np.array_equal(out, pixels)  # it shifts something


def test_gain_gamma_and_offsets_move_values_as_their_formulas_say() -> None:
    pixels = scene()
    has_data = shifts.data_mask(pixels)
    values = pixels[:, has_data].astype(np.float64)
    darker = shifts.gain(pixels, 0.5)[:, has_data]
    np.testing.assert_array_equal(darker, np.clip(np.rint(values * 0.5), 1, 255))
    curved = shifts.gamma(pixels, 2.0)[:, has_data]
    np.testing.assert_allclose(curved, np.clip(np.rint(255 * (values / 255) ** 2), 1, 255), atol=1)
    assert curved.max() == 255  # 255 stays 255 under any gamma
    offset = shifts.band_offsets(pixels, (10, -5, 300, -300))[:, has_data]
    np.testing.assert_array_equal(offset[0], np.clip(values[0] + 10, 1, 255))
    np.testing.assert_array_equal(offset[1], np.clip(values[1] - 5, 1, 255))
    assert (offset[2] == 255).all() and (offset[3] == 1).all()  # clipped, never nodata
    with pytest.raises(ValueError, match="3 offsets for 4 bands"):
        shifts.band_offsets(pixels, (1, 2, 3))


def test_histogram_matching_keeps_a_scene_matched_to_itself_and_takes_the_targets_values() -> None:
    pixels = scene()
    np.testing.assert_array_equal(shifts.match_histograms(pixels, pixels), pixels)
    has_data = shifts.data_mask(pixels)
    target = pixels.copy()
    target[:, has_data] = np.clip(pixels[:, has_data].astype(int) + 20, 1, 255)
    matched = shifts.match_histograms(pixels, target)
    # a monotone remap of each band onto the target's values: equal to the target here
    assert np.abs(matched.astype(int) - target.astype(int)).max() <= 1


def test_leaf_off_lowers_nir_and_raises_red_of_the_greenest_pixels_only() -> None:
    pixels = scene()
    green = shifts.greenness(pixels)
    out = shifts.leaf_off(pixels).astype(int)
    greenest, bare = green >= 1.0, (green == 0) & shifts.data_mask(pixels)
    assert greenest.any() and bare.any()
    assert (out[shifts.NIR][greenest] < pixels[shifts.NIR][greenest]).all()
    assert (out[shifts.RED][greenest] > pixels[shifts.RED][greenest]).all()
    np.testing.assert_array_equal(out[:, bare], pixels[:, bare])


def test_the_season_shift_is_one_monotone_curve_per_band() -> None:
    pixels = scene()
    out = shifts.season_histogram(pixels)
    has_data = shifts.data_mask(pixels)
    for band in range(4):
        order = np.argsort(pixels[band][has_data], kind="stable")
        assert (np.diff(out[band][has_data][order].astype(int)) >= 0).all()
    assert out[shifts.NIR][has_data].mean() < pixels[shifts.NIR][has_data].mean()


def test_mosaic_lays_parts_side_by_side_with_a_gap_of_fill() -> None:
    a, b = np.full((4, 3, 2), 7, np.uint8), np.full((4, 3, 5), 9, np.uint8)
    laid = shifts.mosaic([a, b], gap_px=4, fill=0)
    assert laid.shape == (4, 3, 11)
    assert (laid[..., :2] == 7).all() and (laid[..., 2:6] == 0).all() and (laid[..., 6:] == 9).all()
    with pytest.raises(ValueError, match="different heights"):
        shifts.mosaic([a, np.zeros((4, 4, 2), np.uint8)], gap_px=1, fill=0)


def test_every_patch_is_held_out_once_and_never_trained_on_in_its_fold() -> None:
    for n, folds in ((8, 2), (8, 4), (7, 3), (5, 5)):
        split = fold_split(n, folds)
        assert len(split) == folds
        held = [i for _, ids in split for i in ids]
        assert sorted(held) == list(range(n))
        for train, ids in split:
            assert not set(train) & set(ids) and sorted([*train, *ids]) == list(range(n))
        sizes = [len(ids) for _, ids in split]
        assert max(sizes) - min(sizes) <= 1
    for bad in (1, 9):
        with pytest.raises(SystemExit, match=f"--folds {bad}: must be between 2 and the 8"):
            fold_split(8, bad)


def test_pooled_scores_are_those_of_all_pixels_together() -> None:
    rng = np.random.default_rng(0)
    truths = [rng.choice([0, 2, 2, 2, 3, 4], size=(9, 11)) for _ in range(3)]
    preds = [np.where(rng.random(t.shape) < 0.7, t, rng.integers(1, 5, t.shape)) for t in truths]
    pooled = sum(confusion_matrix(t, p, 5) for t, p in zip(truths, preds, strict=True))
    got = scores(np.asarray(pooled))
    truth = np.concatenate([t.ravel() for t in truths])
    pred = np.concatenate([p.ravel() for p in preds])
    t, p = truth[truth != 0], pred[truth != 0]
    assert got["accuracy"] == pytest.approx(np.mean(t == p))
    ious = {c: np.sum((t == c) & (p == c)) / np.sum((t == c) | (p == c)) for c in (2, 3)}
    assert got["target_miou"] == pytest.approx((ious[2] + ious[3]) / 2)


def test_a_scene_counts_in_its_view_and_in_its_group() -> None:
    one = np.eye(4, dtype=np.int64)
    plain = Scene("unshifted", WITHIN, WITHIN, Path("a.tif"), Path("a_lc.tif"))
    darker = Scene("gain-0.85", "gain", TILE_SHIFTED, Path("b.tif"), Path("b_lc.tif"))
    pooled = pooled_columns([(plain, one), (darker, 2 * one)])
    assert pooled[WITHIN].sum() == 4 and pooled["gain"].sum() == 8
    assert pooled[TILE_SHIFTED].sum() == 8 and pooled["gamma"].sum() == 0


def test_the_other_worlds_shifted_scenes_stay_out_of_the_tiles_columns(tmp_path: Path) -> None:
    """The gain, gamma, offsets and season columns are the tile's held-out patches only: world
    B's shifted scenes count in 'world B, shifted' alone (they were pooled into both)."""
    pairs = []
    for i in range(2):
        image, labels = tmp_path / f"p{i}_naip.tif", tmp_path / f"p{i}_lc.tif"
        grid = {"crs": "EPSG:26917", "transform": Affine(1, 0, 500_000 + 20 * i, 0, -1, 0)}
        profile = {"driver": "GTiff", "width": 8, "height": 6, "dtype": "uint8", **grid}
        with rasterio.open(image, "w", count=4, **profile) as dst:
            dst.write(scene(i)[:, :6, 10:18])
        with rasterio.open(labels, "w", count=1, nodata=15, **profile) as dst:
            dst.write(np.full((1, 6, 8), 2, np.uint8))
        pairs.append((image, labels))
    world = held_out_scenes(
        pairs, tmp_path / "w", index=0, unshifted=WORLD, shifted=WORLD_SHIFTED, per_view=False
    )
    tile = held_out_scenes(
        pairs, tmp_path / "t", index=1, unshifted=WITHIN, shifted=TILE_SHIFTED, per_view=True
    )
    one = np.eye(4, dtype=np.int64)
    pooled = pooled_columns([(s, one) for s in [*world, *tile]])
    for view in shifts.VIEWS:
        assert pooled[view].sum() == 4  # the tile's one scene of that view
    assert pooled[WORLD_SHIFTED].sum() == pooled[TILE_SHIFTED].sum() == 4 * len(shifts.VIEWS)
    assert [s.name for s in tile][1:] == ["gain-1.15", "gamma-1.25", "dehaze", "leaf-off"]
    with rasterio.open(world[0].image) as laid:
        assert laid.width == 8 + GAP_PX + 8 and laid.height == 6


def test_a_default_changes_only_for_a_candidate_better_on_every_seed_in_every_view() -> None:
    assert verdict([0.01, 0.02, 0.001]) == "wins"
    assert verdict([-0.01, -0.02, -0.001]) == "loses"
    assert verdict([0.05, 0.05, -0.001]) == "tie"

    def seeds(*accuracies: tuple[float, float, float, float]) -> list[dict[str, dict[str, float]]]:
        views = ("within-tile CV", "tile, shifted", "world B", "world B, shifted")
        return [{v: {"accuracy": a} for v, a in zip(views, row, strict=True)} for row in accuracies]

    reference = seeds((0.8, 0.7, 0.6, 0.5), (0.8, 0.7, 0.6, 0.5), (0.8, 0.7, 0.6, 0.5))
    everywhere = seeds((0.9, 0.8, 0.7, 0.6), (0.81, 0.71, 0.61, 0.51), (0.85, 0.75, 0.65, 0.55))
    within_only = seeds((0.9, 0.6, 0.7, 0.6), (0.9, 0.6, 0.7, 0.6), (0.9, 0.8, 0.7, 0.6))
    decisions = decide({"ref": reference, "a": everywhere, "b": within_only}, "ref")
    assert decisions["a"]["wins_both"] is True
    assert decisions["b"]["wins_both"] is False
    assert decisions["b"]["views"]["tile, shifted"]["verdict"] == "tie"
    assert decisions["b"]["views"]["within-tile CV"]["verdict"] == "wins"


def test_a_prediction_variant_shares_its_candidates_training_options() -> None:
    base = CANDIDATES[REFERENCE]
    out = with_predict_variants(
        [base, CANDIDATES["jitter-0"]], [("adapt", ("--tta", "flips"))], [REFERENCE]
    )
    assert [c.name for c in out] == [REFERENCE, f"{REFERENCE}+adapt", "jitter-0"]
    assert out[1].train_args == base.train_args and out[1].predict_args == ("--tta", "flips")
    assert isinstance(out[1], Candidate)
