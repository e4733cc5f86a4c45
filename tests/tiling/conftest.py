"""Fixtures of the tiling tests: generated scenes and an Azurite blob emulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite, AzuriteUnavailableError, azurite_server
from tests.tiling.rasters import Scenes, make_scenes


@pytest.fixture(scope="session")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Scenes:
    return make_scenes(tmp_path_factory.mktemp("scenes"))


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """A running Azurite with a fresh container (installed with npm if needed)."""
    try:
        with azurite_server() as server:
            yield server
    except AzuriteUnavailableError as exc:
        pytest.fail(str(exc))


@pytest.fixture()
def out_dir(tmp_path: Path) -> Path:
    return tmp_path
