"""The quicklook `predict` writes beside its map (one COG, and a tiled product's mosaic), the
images it records in the map for `view`, and the quicklook's overwrite policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from click.testing import CliRunner, Result
from PIL import Image

from landcover.cli.app import main
from landcover.prediction.outgrid import TAG_SOURCES
from landcover.view import open_map
from tests.landcover.prediction.inputs import CLASS_MAP


def predict(scene_and_model: tuple[Path, Path], out: str, *extra: str) -> Result:
    scene, model = scene_and_model
    args = ["predict", str(model), str(scene), "--out", out, "--block-px", "40"]
    return CliRunner().invoke(main, [*args, "--batch-size", "8", "--device", "cpu", *extra])


def colours_of(png: Path) -> set[tuple[int, int, int]]:
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3)
    return {tuple(int(v) for v in p) for p in np.unique(pixels, axis=0)}  # type: ignore[misc]


def present_colours(raster: str) -> set[tuple[int, int, int]]:
    with rasterio.open(raster) as ds:
        codes = set(np.unique(ds.read(1)).tolist()) - {0}
    return {c.color for c in CLASS_MAP.classes if c.code in codes}


def test_predict_writes_a_quicklook_in_the_maps_colours_and_records_its_images(
    scene_and_model: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    result = predict(scene_and_model, str(out))
    assert result.exit_code == 0, result.output
    quicklook = tmp_path / "lc.tif.quicklook.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lc.tif", quicklook.name]
    assert present_colours(str(out)) <= colours_of(quicklook)
    with rasterio.open(out) as ds:
        assert json.loads(ds.tags()[TAG_SOURCES]) == [str(scene_and_model[0].resolve())]
    assert open_map(str(out)).sources == (str(scene_and_model[0].resolve()),)

    out.unlink()  # the map gone, a quicklook of an earlier run is the user's to keep
    again = predict(scene_and_model, str(out))
    assert again.exit_code == 2
    assert again.output == (
        f"error: {quicklook} exists; pass --overwrite to replace the quicklook (or pass "
        "--no-quicklook)\n"
    )
    assert not out.exists()


def test_a_tiled_product_gets_a_quicklook_of_its_mosaic(
    scene_and_model: tuple[Path, Path], tmp_path: Path
) -> None:
    product = tmp_path / "tiles"
    result = predict(scene_and_model, f"{product}/", "--tile-size", "64")
    assert result.exit_code == 0, result.output
    mosaic = open_map(str(product))
    assert len(mosaic.parts) > 1  # several tiles
    assert mosaic.sources == (str(scene_and_model[0].resolve()),)
    assert present_colours(mosaic.path) <= colours_of(product / "quicklook.png")
