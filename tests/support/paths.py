"""Where the checkout and its test data are."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL_NAIP_DIR = REPO_ROOT / "tests" / "data" / "naip-real"
