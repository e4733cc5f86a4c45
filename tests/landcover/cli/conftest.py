"""Fixtures of the CLI tests: the inputs of `tile` and `predict` run as ranks, SLURM jobs and Dask
tasks, and what one process makes of them (built once per module that uses them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import shapely

from tests.landcover.prediction.inputs import UTM18, pixels, write_image, write_model
from tests.support.stageruns import predict_args, run, tile_args
from tests.tiling.rasters import Scenes, make_scenes


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four small scenes (two generated, two copies) in one folder."""
    scenes: Scenes = make_scenes(tmp_path_factory.mktemp("rank-scenes"))
    folder = scenes.root / "four"
    folder.mkdir()
    for name, src in zip("abcd", [*scenes.images, *scenes.images], strict=True):
        shutil.copy(src, folder / f"{name}.tif")
    return folder


@pytest.fixture(scope="module")
def one_store(images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store one process tiles from `images` (`tile_args`)."""
    out = tmp_path_factory.mktemp("one") / "one.zarr"
    result = run(*tile_args(images, out))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def predict_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A 75 x 90 px scene, a small_unet model file and a triangle region cutting its blocks."""
    folder = tmp_path_factory.mktemp("predict-ranks")
    scene = write_image(folder / "scene.tif", pixels(75, 90, seed=1))
    model = write_model(folder / "model.pt", seed=7)
    triangle = shapely.Polygon(
        [(500_003.0, 3_999_990.0), (500_085.0, 3_999_930.0), (500_010.0, 3_999_928.0)]
    )
    region = folder / "tri.geojson"
    region.write_text(
        json.dumps(
            {
                "type": "Feature",
                "crs": {"type": "name", "properties": {"name": UTM18}},
                "properties": {},
                "geometry": shapely.geometry.mapping(triangle),
            }
        )
    )
    return scene, model, region


@pytest.fixture(scope="module")
def one_prediction(
    predict_inputs: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """The map one process predicts (`predict_args`), and the first line it printed."""
    out = tmp_path_factory.mktemp("one") / "lc.tif"
    result = run(*predict_args(predict_inputs, out))
    assert result.exit_code == 0, result.output
    return out, result.output.splitlines()[0]
