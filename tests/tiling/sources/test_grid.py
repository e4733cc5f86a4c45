"""Grid arithmetic: chip offsets, edges, read windows and validation blocks; when two pixel grids
are one grid."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from affine import Affine
from hypothesis import given, settings
from hypothesis import strategies as st
from rasterio.crs import CRS

from tiling.errors import TilingError
from tiling.sources.grid import (
    GRID_TOLERANCE_PX,
    ChipGrid,
    aligned_offset,
    chip_grid,
    chip_offsets,
    covering_window,
    north_up_bounds,
    snap_px,
)
from tiling.sources.labels import grid_offset
from tiling.sources.rasters import RasterInfo

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


# -- one pixel grid ---------------------------------------------------------------------------

UTM = Affine(0.6, 0.0, 557_698.8, 0.0, -0.6, 4_320_001.2)


@pytest.mark.parametrize("shift_px", [0.0, 1e-7, 1e-4, 0.9 * GRID_TOLERANCE_PX])
def test_grids_a_fraction_of_the_tolerance_apart_are_one_grid(shift_px: float) -> None:
    # 3 pixels right and 2 down, plus float noise of up to the tolerance (as from a CRS
    # round trip or a decimal print): read by window, never warped.
    moved = UTM @ Affine.translation(-3 + shift_px, -2 - shift_px)
    assert aligned_offset(UTM, moved, span_px=10_000) == (2, 3)


def test_grids_off_by_more_than_the_tolerance_are_warped() -> None:
    half_pixel = UTM @ Affine.translation(0.5, 0)
    assert aligned_offset(UTM, half_pixel, span_px=10) is None
    just_off = UTM @ Affine.translation(2 * GRID_TOLERANCE_PX, 0)
    assert aligned_offset(UTM, just_off, span_px=10) is None
    # Pixel sizes count by the drift they make over the raster, not by their ratio alone.
    finer = Affine(0.6 * (1 + 1e-6), 0.0, UTM.c, 0.0, -0.6, UTM.f)
    assert aligned_offset(UTM, finer, span_px=100) == (0, 0)
    assert aligned_offset(UTM, finer, span_px=10_000) is None
    rotated = UTM @ Affine.rotation(1e-3)
    assert aligned_offset(UTM, rotated, span_px=1) is None


def test_snap_px_absorbs_float_noise_only() -> None:
    assert snap_px(math.ceil, 7.0000001) == 7
    assert snap_px(math.floor, 6.9999999) == 7
    assert snap_px(math.ceil, 7.01) == 8
    assert snap_px(math.floor, 6.99) == 6


def test_labels_on_the_image_grid_up_to_the_tolerance_are_read_not_warped() -> None:
    """tiling (labels) and prediction (landcover.prediction) share GRID_TOLERANCE_PX: a label
    raster 1e-4 px off the image grid (float noise) is on that grid."""

    def info(transform: Affine, crs: str = "EPSG:26918") -> RasterInfo:
        return RasterInfo(
            path="x.tif",
            crs=CRS.from_string(crs),
            transform=transform,
            height=500,
            width=400,
            count=1,
            dtype="uint8",
            nodata=None,
            block_shape=(256, 256),
            mask_kind="none",
        )

    noisy = UTM @ Affine.translation(-10 + 1e-4, 0)
    assert grid_offset(info(UTM), info(noisy)) == (0, 10)
    assert grid_offset(info(UTM), info(noisy, "EPSG:32618")) is None


def test_north_up_bounds_are_left_bottom_right_top() -> None:
    transform = Affine(0.6, 0.0, 1000.0, 0.0, -0.6, 5000.0)
    assert north_up_bounds(transform, 10, 5) == (1000.0, 5000.0 - 3.0, 1000.0 + 6.0, 5000.0)


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        ((12.0, 80.0, 18.0, 88.0), (11, 11, 8, 10)),  # inside: a pixel of margin each side
        ((-5.0, 60.0, 3.0, 100.0), (0, 0, 4, 30)),  # over the corner: clipped to the raster
        ((200.0, 0.0, 210.0, 10.0), None),  # beyond the raster
    ],
)
def test_covering_window_adds_a_pixel_of_margin_and_clips_to_the_raster(
    bounds: tuple[float, float, float, float], expected: tuple[int, int, int, int] | None
) -> None:
    transform = Affine(1.0, 0.0, 0.0, 0.0, -1.0, 100.0)  # 40 x 30 px from (0, 100)
    window = covering_window(bounds, transform, 30, 40)
    found = (
        None if window is None else (window.col_off, window.row_off, window.width, window.height)
    )
    assert found == expected  # (col, row, width, height)
