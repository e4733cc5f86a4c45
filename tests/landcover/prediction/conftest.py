"""Fixtures of the prediction tests: the scene most tests predict, and small_unet model files
(random weights, or a model that always predicts one class), made once per module."""

from __future__ import annotations

from pathlib import Path

import pytest
from affine import Affine

from tests.landcover.prediction.inputs import pixels, write_image, write_model


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """75 x 90 px at 1 m in UTM 18N (not a multiple of the 32 px chip)."""
    return write_image(tmp_path_factory.mktemp("scene") / "scene.tif", pixels(75, 90, seed=1))


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small_unet model file with random weights (seed 7): every pixel's class depends on
    the window that computes it, so seams and misplaced windows show."""
    return write_model(tmp_path_factory.mktemp("models") / "random.pt", seed=7)


@pytest.fixture(scope="module")
def constant_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model file that predicts class 3 everywhere."""
    return write_model(tmp_path_factory.mktemp("models") / "constant.pt", constant_class=3)


# Where `utm17_scene` lies: its ground, in UTM 17N, covers the scene's and more.
UTM17_ORIGIN = (1_040_060.0, 4_016_735.0)


@pytest.fixture(scope="module")
def utm17_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """130 x 110 px at 1 m in UTM 17N over the scene's ground: predicted with --dst-crs
    EPSG:32618 (or beside a UTM 18N image) every pixel is warped, its grid turned ~3.6 degrees
    against the output's."""
    return write_image(
        tmp_path_factory.mktemp("utm17") / "utm17.tif",
        pixels(110, 130, seed=2),
        crs="EPSG:32617",
        transform=Affine(1.0, 0.0, UTM17_ORIGIN[0], 0.0, -1.0, UTM17_ORIGIN[1]),
    )
