"""Per-chip statistics (tiling.tiler.chipstats): band sums and class counts exact, whatever the
pixel values and the chip size."""

from __future__ import annotations

import numpy as np
import pytest

from tiling.tiler.chipstats import add_band_sums, count_classes


@pytest.mark.parametrize("fill", [None, 255])
@pytest.mark.parametrize("size_px", [64, 300])  # 300: a band's sum of squares passes uint32
def test_band_sums_of_a_chip_are_the_exact_sums_over_its_valid_pixels(
    fill: int | None, size_px: int
) -> None:
    rng = np.random.default_rng(3)
    chip = rng.integers(0, 256, size=(4, size_px, size_px), dtype=np.uint8)
    if fill is not None:
        chip[...] = fill  # the largest squares: 255² in every pixel
    valid = rng.random((size_px, size_px)) > 0.3
    chip[:, ~valid] = 0  # as the reader returns invalid pixels
    sums = np.array([1, 2, 3, 4], dtype=np.uint64)  # adds to what is there
    sums_sq = np.array([5, 6, 7, 8], dtype=np.uint64)
    add_band_sums(chip, sums, sums_sq)
    values = [[int(v) for v in band[valid]] for band in chip]
    assert sums.tolist() == [k + sum(band) for k, band in zip([1, 2, 3, 4], values, strict=True)]
    assert sums_sq.tolist() == [
        k + sum(v * v for v in band) for k, band in zip([5, 6, 7, 8], values, strict=True)
    ]


@pytest.mark.parametrize("num_classes", [2, 5, 16, 17, 256])  # counted by compare, then bincount
def test_class_counts_are_those_of_bincount(num_classes: int) -> None:
    rng = np.random.default_rng(num_classes)
    codes = rng.integers(0, num_classes, size=(64, 48), dtype=np.uint8)
    codes[:10] = 0
    expected = np.bincount(codes.ravel(), minlength=num_classes)
    counts = count_classes(codes, num_classes)
    assert counts.dtype == np.int64 and counts.tolist() == expected.tolist()
    assert (
        count_classes(codes[5:20, 3:9], num_classes).tolist()
        == np.bincount(codes[5:20, 3:9].ravel(), minlength=num_classes).tolist()
    )
