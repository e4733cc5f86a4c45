"""The state recipe of README.md runs as written: its commands are read from the README and
run here, every one of them, on the synthetic state mosaic it builds, so the recipe cannot rot;
docs/guide/state.md gives the same commands."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import rasterio
from click.testing import CliRunner

from landcover.cli.app import main
from tests.conftest import REPO_ROOT
from tiling.chipstore.store import open_store

README = REPO_ROOT / "README.md"
PAGE = REPO_ROOT / "docs" / "guide" / "state.md"


def recipe(page: Path = README) -> tuple[list[list[str]], dict[str, Any]]:
    """The commands of the page's "State recipe" (its first bash block, continuation lines
    joined) and the cluster file that follows them."""
    section = page.read_text(encoding="utf-8").split("## State recipe", 1)[1]
    bash = section.split("```bash\n", 1)[1].split("```", 1)[0]
    cluster = section.split("```json\n", 1)[1].split("```", 1)[0]
    lines = bash.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip()], json.loads(cluster)


@pytest.mark.slow
def test_the_state_recipe_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands, cluster = recipe()
    assert recipe(PAGE) == (commands, cluster)
    assert [c[:2] for c in commands] == [
        ["python", "benchmarks/statemosaic.py"], ["landcover", "cluster"],
        ["landcover", "train"], ["landcover", "cluster"], ["landcover", "view"],
    ]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state-local.json").write_text(json.dumps(cluster))
    for argv in commands:
        if argv[0] == "python":
            subprocess.run([sys.executable, str(REPO_ROOT / argv[1]), *argv[2:]], check=True)
            continue
        result = CliRunner().invoke(main, argv[1:])
        assert result.exit_code == 0, f"{shlex.join(argv)}\n{result.output}"
    sources = sorted((tmp_path / "state" / "naip").glob("*.vrt"))
    store = open_store(str(tmp_path / "state" / "chips.zarr"))
    assert len(store.summary.sources) == len(sources) == 40 and store.summary.complete
    product = tmp_path / "state" / "map"
    tiles = sorted(product.glob("E*_N*.tif"))
    assert tiles and (product / "collection.json").is_file()
    assert (tmp_path / "state" / "run" / "model.pt").is_file()
    page = (tmp_path / "state" / "map.html").read_text(encoding="utf-8")
    assert page.count("<tr data-code=") >= 1  # the legend has a row per class on the map
    with rasterio.open(product / "mosaic.vrt") as mosaic:
        assert len(mosaic.files) >= len(tiles)  # the VRT and every tile
