"""`landcover predict --out DIR/ --tile-size PX`: bad tile sizes get one line; `--nproc 2` and
`cluster launch <local cluster.json> -- predict` write the tiles one process writes (the
library's product is tested in tests/landcover/prediction/test_tiled.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from landcover.cli.app import main
from tests.support.stageruns import tile_pixels

LOCAL_SPEC = {
    "name": "two",
    "engine": "local",
    "vmSize": "local",
    "targetNodeCount": 1,
    "processesPerNode": 2,
}


def predict_args(scene_and_model: tuple[Path, Path], out: str, *extra: str) -> list[str]:
    scene, model = scene_and_model
    return [
        "predict", str(model), str(scene), "--out", out, "--block-px", "40",
        "--batch-size", "3", "--device", "cpu", *extra,
    ]  # fmt: skip


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    ("out", "extra", "message"),
    [
        ("tiles/", (), "--out {out} is a directory (a tiled map product); give --tile-size PX"),
        ("tiles/", ("--tile-size", "8"), "--tile-size 8 px: must be at least 16"),
        ("lc.tif", ("--tile-size", "64"), "--tile-size 64 needs --out to be a directory"),
        (
            "tiles/",
            ("--tile-size", "2000", "--max-pixels", "1000000"),
            "--tile-size 2000 px makes tiles of 4,000,000 px, above --max-pixels 1,000,000",
        ),
        (
            "tiles/",
            ("--tile-size", "64", "--probabilities", "p.tif"),
            "--probabilities {dir}/p.tif: a tiled product holds class tiles only",
        ),
    ],
)
def test_a_bad_tile_size_gets_one_line(
    scene_and_model: tuple[Path, Path],
    tmp_path: Path,
    out: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    target = f"{tmp_path}/{out}"
    extra = tuple(f"{tmp_path}/{e}" if e.endswith(".tif") else e for e in extra)
    result = run(*predict_args(scene_and_model, target, *extra))
    assert result.exit_code != 0
    expected = message.format(out=target, dir=tmp_path)
    assert result.stderr.startswith(f"error: {expected}"), result.stderr
    assert result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # refused before any work


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nproc_2_and_a_cluster_launch_write_the_tiles_of_one_process(
    scene_and_model: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one = run(*predict_args(scene_and_model, f"{tmp_path}/one/", "--tile-size", "64"))
    assert one.exit_code == 0, one.output
    # 75 x 90 px from (500000, 4000000): the 64 px lattice cuts 2 x 2 tiles.
    assert one.output.startswith(f"wrote {tmp_path}/one/: 4 tile(s) of 64 px (4 predicted, 0 kept)")
    expected = tile_pixels(tmp_path / "one")
    assert len(expected) == 4
    (tmp_path / "many").mkdir()  # an existing directory is a tiled --out too
    many = run(
        *predict_args(scene_and_model, f"{tmp_path}/many", "--tile-size", "64", "--nproc", "2")
    )
    assert many.exit_code == 0, many.output
    assert tile_pixels(tmp_path / "many") == expected
    cluster_json = tmp_path / "cluster.json"
    cluster_json.write_text(json.dumps(LOCAL_SPEC))
    launched = run(
        "cluster", "launch", str(cluster_json), "--wait", "--",
        *predict_args(scene_and_model, f"{tmp_path}/launched/", "--tile-size", "64"),
    )  # fmt: skip
    assert launched.exit_code == 0, launched.output
    assert tile_pixels(tmp_path / "launched") == expected
    for folder in ("one", "many", "launched"):
        assert (tmp_path / folder / "collection.json").is_file()
        assert (tmp_path / folder / "mosaic.vrt").is_file()
