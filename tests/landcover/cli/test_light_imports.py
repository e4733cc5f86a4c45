"""Commands that read a tiled product's directory and involve no model do not import torch
(seconds, and most of the process's memory): change, sample and evaluate of a product folder
(issue 41; before, its catalog module imported torch for a type hint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import rasterio.shutil

from tests.landcover.evaluation.maps import TRUTH_RAW, write, write_prediction

IMPORTS_TORCH = """
import sys
from click.testing import CliRunner
from landcover.cli.app import main
result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
print("torch" in sys.modules)
"""


def _product(root: Path) -> Path:
    """A tiled product's directory: a tile and its mosaic.vrt."""
    product = root / "prod"
    product.mkdir()
    tile = write_prediction(product / "E400000_N4100000.tif")
    rasterio.shutil.copy(tile, product / "mosaic.vrt", driver="VRT")
    return product


def _args(command: str, product: Path, tmp_path: Path) -> list[str]:
    if command == "change":
        return ["change", f"{product}/", f"{product}/", "--out", str(tmp_path / "change")]
    if command == "sample":
        return ["sample", f"{product}/", "--out", str(tmp_path / "s.csv"), "--size", "19"]
    truth = write(tmp_path / "truth.tif", TRUTH_RAW, nodata=15)
    return ["evaluate", f"{product}/", "--truth", str(truth), "--out", str(tmp_path / "eval")]


@pytest.mark.parametrize("command", ["change", "sample", "evaluate"])
def test_a_product_folder_is_read_without_torch(command: str, tmp_path: Path) -> None:
    args = _args(command, _product(tmp_path), tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_TORCH, *args],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
