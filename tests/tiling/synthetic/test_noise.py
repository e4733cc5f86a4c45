"""Tests of the smooth random fields (tiling/synthetic/noise.py)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tiling.synthetic.noise import NoiseField, lattice_values, smootherstep

FIELD = NoiseField("test", 100.0, 3)


def _centres(start_m: float, count: int) -> npt.NDArray[np.float64]:
    return np.arange(count, dtype=np.float64) + start_m + 0.5


def _correlation(values: npt.NDArray[np.float32], lag: int) -> float:
    """Correlation of the field with itself `lag` columns further east."""
    return float(np.corrcoef(values[:, :-lag].ravel(), values[:, lag:].ravel())[0, 1])


def test_fields_have_the_shape_of_their_coordinates() -> None:
    x, y = _centres(0, 37), _centres(0, 23)
    grid = FIELD.on_grid(1, x, y)
    assert grid.shape == (23, 37) and grid.dtype == np.float32
    points_x = np.linspace(0, 500, 35).reshape(5, 7)
    points = FIELD.at(1, points_x, points_x[::-1])
    assert points.shape == (5, 7) and points.dtype == np.float32


def test_grid_and_points_agree_across_negative_coordinates() -> None:
    # Scene margins reach west and north of the world's origin: the lattice must continue.
    x, y = _centres(-333, 451), _centres(-250, 307)
    grid = FIELD.on_grid(2, x, y)
    rows, cols = np.meshgrid(np.arange(0, 307, 13), np.arange(0, 451, 17), indexing="ij")
    np.testing.assert_allclose(FIELD.at(2, x[cols], y[rows]), grid[rows, cols], atol=1e-5)


def test_same_seed_and_name_give_the_same_field_others_are_independent() -> None:
    x, y = _centres(0, 600), _centres(0, 400)
    first = FIELD.on_grid(7, x, y)
    np.testing.assert_array_equal(FIELD.on_grid(7, x, y), first)
    other_seed = FIELD.on_grid(8, x, y)
    other_name = NoiseField("other", 100.0, 3).on_grid(7, x, y)
    for other in (other_seed, other_name):
        assert np.abs(other - first).mean() > 0.1
        assert abs(np.corrcoef(other.ravel(), first.ravel())[0, 1]) < 0.3


def test_values_stay_within_minus_one_and_one_and_use_the_range() -> None:
    x, y = _centres(0, 1500), _centres(0, 1500)
    for field in (NoiseField("one", 30.0, 1), NoiseField("many", 30.0, 5)):
        values = field.on_grid(0, x, y)
        assert values.min() >= -1.0 and values.max() <= 1.0, field
        assert abs(float(values.mean())) < 0.05, field
        assert values.std() > 0.2 and values.max() - values.min() > 1.4, field


def test_smoothness_scales_with_the_spacing() -> None:
    # A field is a function of position / spacing_m: 10 times the spacing, 10 times the scale.
    x, y = _centres(0, 300), _centres(0, 200)
    fine = NoiseField("scale", 10.0, 3).on_grid(4, x, y)
    coarse = NoiseField("scale", 100.0, 3).on_grid(4, x * 10, y * 10)
    np.testing.assert_allclose(fine, coarse, atol=1e-5)

    # Close neighbours (a tenth of the spacing) agree, points 3 spacings apart do not.
    values = NoiseField("scale", 20.0, 1).on_grid(4, _centres(0, 2000), _centres(0, 400))
    assert _correlation(values, 2) > 0.95
    assert abs(_correlation(values, 60)) < 0.1


def test_lattice_values_are_a_uniform_hash_of_the_point_and_key() -> None:
    iy, ix = np.arange(-150, 150)[:, None], np.arange(-200, 200)[None, :]
    values = lattice_values(iy, ix, np.uint64(11))
    assert values.shape == (300, 400) and values.dtype == np.float32
    assert values.min() >= -1.0 and values.max() < 1.0
    counts = np.histogram(values, bins=10, range=(-1, 1))[0]
    assert counts.min() > 0.9 * values.size / 10  # uniform, no favourite values
    rows, cols = np.broadcast_arrays(iy, ix)
    np.testing.assert_array_equal(lattice_values(rows[5], cols[5], np.uint64(11)), values[5])
    assert (lattice_values(iy, ix, np.uint64(12)) != values).mean() > 0.99


def test_smootherstep_is_flat_at_both_ends() -> None:
    t = np.array([0.0, 1e-3, 0.5, 1 - 1e-3, 1.0])
    np.testing.assert_allclose(smootherstep(t), [0.0, 1e-8, 0.5, 1 - 1e-8, 1.0], atol=1e-7)
    ramp = smootherstep(np.linspace(0, 1, 101))
    assert (np.diff(ramp) >= 0).all()
