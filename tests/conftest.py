"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_NAIP_DIR = REPO_ROOT / "tests" / "data" / "naip-real"


@pytest.fixture(scope="session")
def real_naip_dir() -> Path:
    """The six real NAIP GeoTIFFs in tests/data/naip-real (0.6 m, NIR tagged as alpha, ...)."""
    if not REAL_NAIP_DIR.is_dir():
        pytest.fail(f"real NAIP test data missing at {REAL_NAIP_DIR}; restore tests/data from git")
    return REAL_NAIP_DIR


@pytest.fixture(scope="session")
def real_naip_paths(real_naip_dir: Path) -> list[Path]:
    return sorted(real_naip_dir.glob("*.tif"))
