"""Chip-grid arithmetic: offsets, edges, read windows and validation blocks."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiling.errors import TilingError
from tiling.grid import ChipGrid, chip_grid, chip_offsets

lengths_and_chips = st.integers(1, 600).flatmap(
    lambda chip: st.tuples(st.integers(chip, chip * 12), st.just(chip), st.integers(1, chip))
)


@settings(deadline=None)  # no timed asserts
@given(lengths_and_chips)
def test_offsets_cover_every_pixel_without_leaving_the_image(
    case: tuple[int, int, int],
) -> None:
    length, chip, stride = case
    offsets = chip_offsets(length, chip, stride)
    assert offsets[0] == 0
    assert all(0 <= o <= length - chip for o in offsets)
    assert list(offsets) == sorted(set(offsets))
    assert all(b - a <= stride for a, b in itertools.pairwise(offsets))
    covered = np.zeros(length, dtype=bool)
    for o in offsets:
        covered[o : o + chip] = True
    assert covered.all()
    # ceil((L - C) / s) + 1 chips: the regular ones plus at most one edge-aligned chip
    assert len(offsets) == -(-(length - chip) // stride) + 1


@settings(deadline=None)  # no timed asserts
@given(st.integers(1, 50), st.integers(1, 60), st.integers(1, 400))
def test_sparse_stride_samples_regularly_and_adds_no_edge_chip(
    chip: int, extra: int, length_extra: int
) -> None:
    stride = chip + extra
    length = chip + length_extra
    offsets = chip_offsets(length, chip, stride)
    assert offsets == tuple(range(0, length - chip + 1, stride))


def test_edge_chip_is_flush_with_the_image_edge() -> None:
    assert chip_offsets(300, 128, 128) == (0, 128, 172)
    assert chip_offsets(256, 128, 128) == (0, 128)
    assert chip_offsets(300, 128, 64) == (0, 64, 128, 172)
    assert chip_offsets(128, 128, 128) == (0,)


def test_chip_larger_than_image_names_the_image_and_the_fix() -> None:
    with pytest.raises(
        TilingError,
        match=r"naip/a.tif: chip size 256 is larger than the image "
        r"\(200 x 300 px\); pass --chip-size 200 or smaller",
    ):
        chip_grid(200, 300, 256, 256, where="naip/a.tif")


@settings(deadline=None)  # no timed asserts
@given(
    st.integers(4, 64).flatmap(
        lambda c: st.tuples(
            st.integers(c, 30 * c),
            st.integers(c, 30 * c),
            st.just(c),
            st.integers(c // 2, 2 * c),
            st.integers(1, 900),
            st.integers(1, 900),
        )
    )
)
def test_read_windows_hold_every_chip_once_and_contain_them(
    case: tuple[int, int, int, int, int, int],
) -> None:
    height, width, chip, stride, min_h, max_w = case
    grid = ChipGrid(height, width, chip, stride)
    windows = grid.read_windows(min_height_px=min_h, max_width_px=max_w)
    seen = Counter(ij for w in windows for ij in w.chips)
    assert set(seen) == {(i, j) for i in range(grid.rows) for j in range(grid.cols)}
    assert set(seen.values()) == {1}
    for w in windows:
        assert w.row_px >= 0 and w.row_px + w.height <= height
        assert w.col_px >= 0 and w.col_px + w.width <= width
        assert w.width <= max(max_w, chip) or len({j for _, j in w.chips}) == 1
        for i, j in w.chips:
            r, c = grid.chip_origin(i, j)
            assert w.row_px <= r and r + chip <= w.row_px + w.height
            assert w.col_px <= c and c + chip <= w.col_px + w.width


def test_read_windows_span_at_least_the_block_height_when_the_grid_allows() -> None:
    grid = ChipGrid(1100, 700, 128, 128)
    windows = grid.read_windows(min_height_px=512, max_width_px=10_000)
    assert [w.height for w in windows] == [512, 512, 128]  # 4 + 4 + 1 (edge) chip rows
    assert [w.row_px for w in windows] == [0, 512, 972]
