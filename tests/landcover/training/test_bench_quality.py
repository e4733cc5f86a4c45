"""benchmarks/bench_quality.py's fold split, pooled scoring and brightness-shifted copies, on
tiny synthetic data (the benchmark itself trains for minutes: it is not a test)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import rasterio
from rasterio.transform import from_origin

from landcover.evaluation import confusion_matrix

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the bench imports its sibling resultfile.py
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_quality", BENCHMARKS / "bench_quality.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_every_patch_is_held_out_once_and_never_trained_on_in_its_fold(bench: ModuleType) -> None:
    for n, folds in ((8, 4), (7, 3), (5, 5)):
        split = bench.fold_split(n, folds)
        assert len(split) == folds
        held = [i for _, ids in split for i in ids]
        assert sorted(held) == list(range(n))
        for train, ids in split:
            assert not set(train) & set(ids) and sorted([*train, *ids]) == list(range(n))
        sizes = [len(ids) for _, ids in split]
        assert max(sizes) - min(sizes) <= 1
    for bad in (1, 9):
        with pytest.raises(SystemExit, match=f"--folds {bad}: must be between 2 and the 8"):
            bench.fold_split(8, bad)


def test_pooled_scores_are_those_of_all_pixels_together(bench: ModuleType) -> None:
    rng = np.random.default_rng(0)
    truths = [rng.choice([0, 2, 2, 2, 3, 4], size=(9, 11)) for _ in range(3)]
    preds = [np.where(rng.random(t.shape) < 0.7, t, rng.integers(1, 5, t.shape)) for t in truths]
    pooled = bench.Pooled(5)
    for t, p in zip(truths, preds, strict=True):
        pooled.add(confusion_matrix(t, p, 5))
    scores = pooled.scores()
    truth, pred = (
        np.concatenate([t.ravel() for t in truths]),
        np.concatenate([p.ravel() for p in preds]),
    )
    labelled = truth != 0
    t, p = truth[labelled], pred[labelled]
    assert scores["pixels"] == labelled.sum()
    assert scores["pixel_accuracy"] == pytest.approx(np.mean(t == p))
    ious = {c: np.sum((t == c) & (p == c)) / np.sum((t == c) | (p == c)) for c in (1, 2, 3, 4)}
    assert scores["target_miou"] == pytest.approx((ious[2] + ious[3]) / 2)
    assert scores["per_class_iou"]["low vegetation"] == pytest.approx(ious[3])
    assert scores["majority_accuracy"] == pytest.approx(np.mean(t == 2))


def test_a_shifted_copy_scales_every_band_and_keeps_nodata(
    bench: ModuleType, tmp_path: Path
) -> None:
    pixels = np.array([[[0, 100], [200, 250]]] * 4, dtype=np.uint8)
    source = tmp_path / "p_naip.tif"
    profile = {"driver": "GTiff", "width": 2, "height": 2, "count": 4, "dtype": "uint8"}
    transform = from_origin(500000, 4000000, 1, 1)
    with rasterio.open(source, "w", crs="EPSG:26917", transform=transform, **profile) as dst:
        dst.write(pixels)
    darker = bench.scaled_copy(source, 0.85, tmp_path)
    brighter = bench.scaled_copy(source, 1.15, tmp_path)
    with rasterio.open(darker) as d, rasterio.open(brighter) as b:
        assert d.transform == transform and d.crs.to_epsg() == 26917
        assert d.read(1).tolist() == [[0, 85], [170, 212]]
        assert b.read(4).tolist() == [[0, 115], [230, 255]]  # clipped at 255
