"""Fixtures of the prediction tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.landcover.prediction.inputs import pixels, write_image


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """75 x 90 px at 1 m in UTM 18N (not a multiple of the 32 px chip)."""
    return write_image(tmp_path_factory.mktemp("scene") / "scene.tif", pixels(75, 90, seed=1))
