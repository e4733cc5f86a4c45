"""A tiled product's directory belongs to one product key (landcover.prediction.tileowner):

- a directory holding anything the product did not make (a user's collection.json,
  mosaic.vrt, quicklook.png, a file named like an item or a tile, another product's index of
  another model, region or lattice) is refused in one line without --overwrite, the file
  untouched; with --overwrite nothing of the old product is left (tiles, items, records
  outside the new lattice) and files at names no product uses stay;
- in the product's own directory a user's `E…tif` is named as not a tile of this product,
  and a tile put in place by a run that died before its record is predicted again without
  --overwrite (its tags hold the product key);
- half-written files of a killed run (`.part.tif` in its scratch directory) are removed by
  the next run, never those of a live one.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pystac
import pytest
import rasterio

from landcover.errors import OutputExistsError
from landcover.prediction.config import PredictConfig
from landcover.prediction.tiled import TiledResult, predict_product
from landcover.prediction.tileowner import PRODUCT_RECORD
from landcover.prediction.tileplan import TiledSetup
from landcover.prediction.tilerecords import TAG_PRODUCT, ProductDir
from tests.landcover.prediction.inputs import (
    pixels,
    utm_region,
    write_image,
    write_model,
)

TILE_PX = 64
USER_BYTES = b"the user's own file\n"


@pytest.fixture(scope="module")
def made(
    scene: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, PredictConfig, TiledResult]:
    """A finished product of the scene (4 tiles of 64 px) and its config."""
    folder = tmp_path_factory.mktemp("owned")
    model = write_model(folder / "model.pt", seed=7)
    config = PredictConfig(
        str(model), (str(scene),), f"{folder / 'tiles'}/", device="cpu", block_px=40
    )
    return folder / "tiles", config, predict_product(TiledSetup(config, TILE_PX))


def copy_of(
    made: tuple[Path, PredictConfig, TiledResult], into: Path
) -> tuple[Path, PredictConfig]:
    tiles, config, _ = made
    shutil.copytree(tiles, into)
    return into, dataclasses.replace(config, out=f"{into}/")


def tile_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("E*_N*.tif"))


def product_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def a_tile_name(made: tuple[Path, PredictConfig, TiledResult]) -> str:
    return tile_names(made[0])[0]


# What a user may have in the directory before the first run: (file, how it is made).
Planted = Callable[[Path, str], Path]


def _file(name: str) -> Planted:
    def plant(folder: Path, tile: str) -> Path:
        path = folder / name.format(tile=tile)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(USER_BYTES)
        return path

    return plant


def _users_raster(folder: Path, tile: str) -> Path:
    return write_image(folder / f"{tile}.tif", pixels(20, 20, seed=3))


USER_FILES: dict[str, Planted] = {
    "collection.json": _file("collection.json"),
    "mosaic.vrt": _file("mosaic.vrt"),
    "quicklook.png": _file("quicklook.png"),
    "an item's name": _file("{tile}.json"),
    "a tile's name": _file("{tile}.tif"),
    "a GeoTIFF at a tile's name": _users_raster,
    "a record's name": _file("records/{tile}.json"),
    "notes.txt": _file("notes.txt"),
}


@pytest.mark.parametrize("what", list(USER_FILES))
def test_a_directory_with_a_users_file_is_refused_and_overwrite_replaces_only_product_names(
    what: str, made: tuple[Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    _, config, first = made
    folder = tmp_path / "tiles"
    folder.mkdir()
    planted = USER_FILES[what](folder, a_tile_name(made))
    before = planted.read_bytes()
    config = dataclasses.replace(config, out=f"{folder}/")
    with pytest.raises(OutputExistsError) as caught:
        predict_product(TiledSetup(config, TILE_PX))
    message = str(caught.value)
    assert "\n" not in message and "pass --overwrite" in message
    assert str(planted.relative_to(folder)) in message and "from another run" not in message
    assert planted.read_bytes() == before
    assert product_files(folder) == [str(planted.relative_to(folder))]  # nothing written
    again = predict_product(TiledSetup(dataclasses.replace(config, overwrite=True), TILE_PX))
    assert again.tiles == first.tiles
    if what == "notes.txt":  # a name no product uses: left alone
        assert planted.read_bytes() == before
    else:
        assert not planted.exists() or planted.read_bytes() != before
    assert tile_names(folder) == tile_names(made[0])
    predict_product(TiledSetup(config, TILE_PX))  # the product's now: a rerun resumes


@pytest.mark.parametrize(
    "change",
    ["another lattice", "a smaller region", "another model"],
)
def test_another_products_directory_is_refused_and_overwrite_leaves_nothing_of_it(
    change: str, made: tuple[Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    folder, config = copy_of(made, tmp_path / "tiles")
    tile_px = TILE_PX
    if change == "another lattice":
        tile_px = 32
    elif change == "a smaller region":
        config = dataclasses.replace(
            config, region=utm_region(500_001, 3_999_990, 500_020, 3_999_999)
        )
    else:
        other = write_model(tmp_path / "other.pt", seed=8)
        config = dataclasses.replace(config, model=str(other))
    old = product_files(folder)
    with pytest.raises(OutputExistsError, match=r"holds another tiled product .*--overwrite"):
        predict_product(TiledSetup(config, tile_px))
    assert product_files(folder) == old
    result = predict_product(TiledSetup(dataclasses.replace(config, overwrite=True), tile_px))
    names = tile_names(folder)
    assert len(names) == result.tiles
    expected = {f"{n}.tif" for n in names} | {f"{n}.json" for n in names}
    expected |= {f"records/{n}.json" for n in names}
    expected |= {"collection.json", "mosaic.vrt", PRODUCT_RECORD}
    assert set(product_files(folder)) == expected
    items = pystac.Collection.from_file(str(folder / "collection.json")).get_items()
    assert sorted(item.id for item in items) == names
    if change == "a smaller region":
        assert result.tiles == 1 < made[2].tiles


def test_a_users_tile_file_in_the_products_directory_is_not_called_another_run(
    made: tuple[Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    folder, config = copy_of(made, tmp_path / "tiles")
    name = a_tile_name(made)
    (folder / "records" / f"{name}.json").unlink()
    _users_raster(folder, name)
    with pytest.raises(OutputExistsError) as caught:
        predict_product(TiledSetup(config, TILE_PX))
    assert str(caught.value).startswith(f"{folder}/{name}.tif is not a tile of this product")
    assert "another run" not in str(caught.value)


def test_a_tile_whose_record_a_crash_lost_is_predicted_again_without_overwrite(
    made: tuple[Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    folder, config = copy_of(made, tmp_path / "tiles")
    name = a_tile_name(made)
    with rasterio.open(folder / f"{name}.tif") as ds:
        assert ds.tags(1)[TAG_PRODUCT]  # how the orphan is known
    with rasterio.open(folder / "mosaic.vrt") as ds:
        assert TAG_PRODUCT not in ds.tags(1)  # one tile's tag, not the mosaic's
    (folder / "records" / f"{name}.json").unlink()  # died between the rename and the record
    again = predict_product(TiledSetup(config, TILE_PX))
    assert (again.tiles, again.predicted) == (made[2].tiles, 1)
    assert (folder / "records" / f"{name}.json").exists()


def test_a_killed_runs_scratch_files_are_removed_by_the_next_run_and_a_live_ones_kept(
    made: tuple[Path, PredictConfig, TiledResult], tmp_path: Path
) -> None:
    folder, config = copy_of(made, tmp_path / "tiles")
    # A writer killed with a half-written tile in its scratch directory (os._exit: no clean-up).
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from tiling.staged.folder import StagedFolder\n"
            f"with StagedFolder({str(folder)!r}).scratch() as s:\n"
            "    open(os.path.join(s, '.E1_N1.abc.tiles.part.tif'), 'wb').write(b'x')\n"
            "    print(s, flush=True); os._exit(9)",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    left = Path(killed.stdout.strip())
    assert killed.returncode == 9 and (left / ".E1_N1.abc.tiles.part.tif").exists()
    with ProductDir(str(folder)).scratch() as live:
        assert ProductDir(str(folder)).clear_stale_scratch() == []  # the live one stays
        assert Path(live).is_dir()
        assert not left.exists()  # the killed one went when this scratch was made
    (folder / f"{a_tile_name(made)}.tif").unlink()
    again = predict_product(TiledSetup(config, TILE_PX))
    assert again.predicted == 1
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []


def test_the_claim_records_the_products_key(
    made: tuple[Path, PredictConfig, TiledResult],
) -> None:
    claim = json.loads((made[0] / PRODUCT_RECORD).read_text())
    assert claim["format"] == "landcover-map-product" and claim["tiles"] == made[2].tiles
    with rasterio.open(made[0] / f"{a_tile_name(made)}.tif") as ds:
        assert ds.tags(1)[TAG_PRODUCT] == claim["key"]
