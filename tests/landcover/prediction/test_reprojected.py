"""Reprojected sources are exact across schedules (landcover.prediction.mosaic's warp lattice):
a pixel warped from an image in another CRS comes out the same whichever window, block, tile
or rank computes it, so the one COG does not change with --block-px, the tiled product's
mosaic equals the one COG and ranks write what one process writes.

The runs cut the lattice to `CELL_PX` (several cells over these tiny grids; the reads also
run at the default, one cell for the grid): a read window, a block, a tile that starts inside
a cell is what the approximate transformer used to fit its own way.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio

from landcover.prediction import mosaic
from landcover.prediction.config import PredictConfig
from landcover.prediction.gridwindow import Window
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.outgrid import plan_output_grid
from landcover.prediction.region import parse_bbox
from landcover.prediction.runner import predict_region
from landcover.prediction.setup import open_images
from landcover.prediction.tiled import predict_product
from landcover.prediction.tileplan import TiledSetup
from tests.landcover.prediction.inputs import UTM18
from tiling.sources.reader import RasterReader

CELL_PX = 32
TILE_PX = 64
# A box of the scene's ground in UTM 18N, inside `utm17_scene`'s footprint.
BOX = "500004,3999922,500091,3999996"


@pytest.fixture(params=[CELL_PX, mosaic.WARP_CELL_PX], ids=["cells-32", "cells-default"])
def cell_px(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(mosaic, "WARP_CELL_PX", request.param)
    return int(request.param)


@pytest.fixture
def small_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells of `CELL_PX`: blocks, tiles and ranks' rows start inside cells."""
    monkeypatch.setattr(mosaic, "WARP_CELL_PX", CELL_PX)


@pytest.fixture(params=["dst-crs", "beside-utm18"])
def sources(
    request: pytest.FixtureRequest, scene: Path, utm17_scene: Path
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The images and options of a reprojected prediction: the UTM 17N image onto a UTM 18N
    grid named by --dst-crs, or after a UTM 18N image (whose grid the output takes, the 17N
    one warped where the first has no data)."""
    if request.param == "dst-crs":
        return (str(utm17_scene),), {"dst_crs": UTM18}
    return (str(scene), str(utm17_scene)), {}


def config_for(
    model: Path, images: tuple[str, ...], out: Path | str, **options: Any
) -> PredictConfig:
    region = parse_bbox(BOX, crs=UTM18)
    return PredictConfig(str(model), images, str(out), device="cpu", region=region, **options)


def test_warped_pixels_are_the_same_in_any_window_that_reads_them(
    utm17_scene: Path, cell_px: int
) -> None:
    sources = open_images([str(utm17_scene)])
    plan = plan_output_grid(sources, None, resolution_m=1.0, crs=rasterio.CRS.from_epsg(32618))
    grid = plan.grid
    whole = Window(-5, -7, grid.height + 12, grid.width + 9)  # reaching past the grid
    reader = RasterReader()
    try:
        data, valid = read_mosaic(plan, reader, whole)
        assert valid.mean() > 0.6 and len(np.unique(data[0][valid])) > 50
        rng = np.random.default_rng(0)
        for _ in range(12):
            height, width = (int(v) for v in rng.integers(5, 70, size=2))
            row = int(rng.integers(whole.row, whole.row_stop - height))
            col = int(rng.integers(whole.col, whole.col_stop - width))
            part = Window(row, col, height, width)
            got, got_valid = read_mosaic(plan, RasterReader(), part)
            rows, cols = part.slices(whole)
            np.testing.assert_array_equal(got, data[:, rows, cols])
            np.testing.assert_array_equal(got_valid, valid[rows, cols])
    finally:
        reader.close()


def test_one_cog_is_the_same_at_any_block_size(
    random_model: Path,
    sources: tuple[tuple[str, ...], dict[str, Any]],
    small_cells: None,
    tmp_path: Path,
) -> None:
    images, options = sources
    outputs = []
    for block_px in (24, 40):
        out = tmp_path / f"{block_px}.tif"
        predict_region(config_for(random_model, images, out, block_px=block_px, **options))
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    with rasterio.open(tmp_path / "24.tif") as ds:
        assert ds.crs == rasterio.CRS.from_epsg(32618)
        assert len(np.unique(ds.read(1))) > 1  # a model that sees the pixels


def test_tiled_mosaic_equals_the_one_cog_and_ranks_write_the_tiles_of_one_process(
    random_model: Path,
    sources: tuple[tuple[str, ...], dict[str, Any]],
    small_cells: None,
    tmp_path: Path,
) -> None:
    images, options = sources
    one = config_for(random_model, images, tmp_path / "one.tif", block_px=24, **options)
    predict_region(one)
    tiled = dataclasses.replace(one, out=f"{tmp_path / 'tiles'}/", block_px=40)
    predict_product(TiledSetup(tiled, TILE_PX))
    with (
        rasterio.open(tmp_path / "one.tif") as a,
        rasterio.open(tmp_path / "tiles/mosaic.vrt") as b,
    ):
        expected, mosaic_pixels = a.read(), b.read()
        assert (a.transform, a.crs) == (b.transform, b.crs)
    assert len(np.unique(expected)) > 1
    np.testing.assert_array_equal(mosaic_pixels, expected)
    many = dataclasses.replace(tiled, out=f"{tmp_path / 'many'}/", block_px=16)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(predict_product, TiledSetup(many, TILE_PX), rank=r, world_size=2)
            for r in range(2)
        ]
        for future in futures:
            future.result(timeout=300)
    names = sorted(p.name for p in (tmp_path / "tiles").glob("E*_N*.tif"))
    assert len(names) > 1
    assert names == sorted(p.name for p in (tmp_path / "many").glob("E*_N*.tif"))
    for name in names:
        with (
            rasterio.open(tmp_path / "tiles" / name) as a,
            rasterio.open(tmp_path / "many" / name) as b,
        ):
            np.testing.assert_array_equal(a.read(), b.read())


def test_ranks_write_the_one_process_cog_of_a_reprojected_source_byte_for_byte(
    random_model: Path,
    sources: tuple[tuple[str, ...], dict[str, Any]],
    small_cells: None,
    tmp_path: Path,
) -> None:
    images, options = sources
    one = config_for(random_model, images, tmp_path / "one" / "lc.tif", block_px=16, **options)
    many = dataclasses.replace(one, out=str(tmp_path / "many" / "lc.tif"))
    predict_region(one)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(predict_region, many, rank=r, world_size=2) for r in range(2)]
        for future in futures:
            future.result(timeout=300)
    assert Path(one.out).read_bytes() == Path(many.out).read_bytes()


def test_the_cells_a_reader_keeps_are_bounded_and_their_eviction_changes_no_pixel(
    utm17_scene: Path, small_cells: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = open_images([str(utm17_scene)])
    plan = plan_output_grid(sources, None, resolution_m=1.0, crs=rasterio.CRS.from_epsg(32618))
    whole = plan.grid.window
    reader = RasterReader()
    try:
        expected = read_mosaic(plan, reader, whole)
        monkeypatch.setattr(mosaic, "_CELL_CACHE_ENTRIES", 3)
        small = RasterReader()
        got = [read_mosaic(plan, small, block) for block in whole.blocks(20)]
        assert len(mosaic._CellCache.of(small)._cells) <= 3
        for block, (data, valid) in zip(whole.blocks(20), got, strict=True):
            rows, cols = block.slices(whole)
            np.testing.assert_array_equal(data, expected[0][:, rows, cols])
            np.testing.assert_array_equal(valid, expected[1][rows, cols])
        small.close()
    finally:
        reader.close()
