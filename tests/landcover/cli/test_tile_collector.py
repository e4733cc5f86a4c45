"""`landcover tile` imports the tiling stack with the cyclic collector paused and freezes it
(`landcover.cli.tiling`): the collector's state is the caller's again afterwards, and a
process freezes its objects once, not at each tile it runs."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from tests.tiling.rasters import Scenes, make_scenes


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Scenes:
    return make_scenes(tmp_path_factory.mktemp("collector-scenes"))


def tile_args(scenes: Scenes, out: Path) -> list[str]:
    return ["tile", *map(str, scenes.images), "--out", str(out), "--chip-size", "64"]


@pytest.mark.parametrize("enabled", [True, False])
def test_tile_leaves_the_collector_as_it_found_it(
    scenes: Scenes, tmp_path: Path, enabled: bool
) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        result = CliRunner().invoke(main, tile_args(scenes, tmp_path / "chips.zarr"))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert result.exit_code == 0, result.output


def test_a_tile_process_freezes_its_imports_once(scenes: Scenes, tmp_path: Path) -> None:
    # a fresh process: in this one the tiling stack may already be imported
    script = (
        "import gc, sys\n"
        "from click.testing import CliRunner\n"
        "from landcover.cli.app import main\n"
        f"args = {tile_args(scenes, tmp_path / 'a.zarr')!r}\n"
        "assert gc.get_freeze_count() == 0\n"
        "assert CliRunner().invoke(main, args).exit_code == 0\n"
        "first = gc.get_freeze_count()\n"
        "junk = [[] for _ in range(1000)]\n"
        "assert CliRunner().invoke(main, args + ['--overwrite']).exit_code == 0\n"
        "print(first, gc.get_freeze_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    first, second = map(int, done.stdout.split())
    # frozen objects may die (the count falls), but the 1000 made since are not frozen
    assert first > 0 and second < first + 1000
