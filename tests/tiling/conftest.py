"""Fixtures of the tiling tests: generated scenes (Azurite is a fixture of tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiling.rasters import Scenes, make_scenes


@pytest.fixture(scope="session")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Scenes:
    return make_scenes(tmp_path_factory.mktemp("scenes"))


@pytest.fixture()
def out_dir(tmp_path: Path) -> Path:
    return tmp_path
