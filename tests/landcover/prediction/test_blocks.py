"""The block schedule (landcover.prediction.blocks): blocks tile the grid, every window is
owned by one block, the region mask follows pixel centres, and `--block-px auto` resolves to
an edge from the model and the device, once, for every reader of the prepared config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from affine import Affine
from click.testing import CliRunner
from rasterio.crs import CRS
from shapely.geometry import box

from landcover.cli.app import main
from landcover.cli.predict import predict_command
from landcover.prediction.blend import WindowLayout
from landcover.prediction.blocks import (
    block_bytes_per_px,
    block_schedule,
    blocks,
    owned_windows,
    region_mask,
    resolve_block_px,
)
from landcover.prediction.choices import (
    BLOCK_AUTO_CPU_BYTES,
    BLOCK_AUTO_DEVICE_PX,
    BLOCK_AUTO_MAX_PX,
)
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import pixel_settings
from landcover.prediction.gridwindow import Window
from landcover.prediction.outfiles import COG_BLOCK_PX
from landcover.prediction.outgrid import OutputGrid
from landcover.prediction.prepared import prepare_prediction
from landcover.prediction.ranks import RankShare

GRID = OutputGrid(CRS.from_epsg(32618), Affine(1.0, 0.0, 500_000.0, 0.0, -1.0, 4_000_000.0), 90, 75)


@pytest.mark.parametrize("block_px", [16, 33, 64, 128])
def test_blocks_cover_the_grid_once(block_px: int) -> None:
    hits = np.zeros((GRID.height, GRID.width), dtype=np.int64)
    for row0, col0, height, width in blocks(GRID, block_px):
        assert 0 < height <= block_px and 0 < width <= block_px
        hits[row0 : row0 + height, col0 : col0 + width] += 1
    assert (hits == 1).all()


@pytest.mark.parametrize(("block_px", "size", "overlap"), [(16, 32, 8), (33, 32, 0), (64, 16, 4)])
def test_every_window_is_owned_by_one_block(block_px: int, size: int, overlap: int) -> None:
    layout = WindowLayout.over(GRID.height, GRID.width, size=size, overlap=overlap)
    owned = 0
    for row0, col0, height, width in blocks(GRID, block_px):
        rows = layout.rows_touching(row0, row0 + height)
        cols = layout.cols_touching(col0, col0 + width)
        owned += owned_windows(layout, rows, cols, Window(row0, col0, height, width))
    assert owned == layout.num_windows


def test_region_mask_takes_pixels_whose_centre_is_inside() -> None:
    # Holds the centres of columns 2..4 and rows 1..2 of the block at (row 10, col 20).
    region = box(500_022.4, 3_999_987.4, 500_025.0, 3_999_989.0)
    mask = region_mask(region, GRID, Window(10, 20, 5, 8))
    expected = np.zeros((5, 8), dtype=bool)
    expected[1:3, 2:5] = True
    assert mask.dtype == bool
    assert (mask == expected).all()


@pytest.mark.parametrize(("block_px", "world_size"), [(16, 3), (33, 2), (64, 4)])
def test_every_schedule_is_the_one_block_schedule(block_px: int, world_size: int) -> None:
    # A rank's share and a tile walk the blocks of their own window through the one
    # schedule: the shares' blocks, in rank order, are the whole grid's, windows included.
    layout = WindowLayout.over(GRID.height, GRID.width, size=32, overlap=8)
    whole = block_schedule(layout, GRID.window, block_px)
    assert [b.window for b in whole] == blocks(GRID, block_px)
    assert sum(b.owned_windows for b in whole) == layout.num_windows
    assert block_schedule(layout, GRID.window, block_px) is whole  # computed once
    rows = len(GRID.window.block_rows(block_px))
    step = -(-rows // world_size) * block_px
    shares = [
        RankShare(r, min(r * step, GRID.height), min((r + 1) * step, GRID.height))
        for r in range(world_size)
    ]
    parts = [b for s in shares for b in block_schedule(layout, s.window(GRID), block_px)]
    assert parts == list(whole)
    tile = Window(10, 7, 50, 41)
    in_tile = block_schedule(layout, tile, block_px)
    assert [b.window.col == tile.col for b in in_tile] == [b.starts_row for b in in_tile]
    for block in in_tile:
        assert block.extent.row <= block.window.row and block.extent.col <= block.window.col
        assert block.extent.row_stop >= block.window.row_stop
        assert block.extent.col_stop >= block.window.col_stop


# -- the block edge (--block-px auto) -------------------------------------------------------------

CHIP_LAYOUT = WindowLayout.over(4096, 4096, size=256, overlap=64)


def _auto(num_classes: int, layout: WindowLayout = CHIP_LAYOUT, **kw: bool) -> int:
    kw = {"probabilities": False, "on_cpu": True, **kw}
    return resolve_block_px(None, num_classes=num_classes, layout=layout, **kw)


def test_an_explicit_block_edge_is_kept_whatever_the_model_and_device() -> None:
    for on_cpu in (True, False):
        edge = resolve_block_px(
            40, num_classes=14, layout=CHIP_LAYOUT, probabilities=True, on_cpu=on_cpu
        )
        assert edge == 40


@pytest.mark.parametrize("num_classes", [2, 5, 8, 14, 40])
@pytest.mark.parametrize("probabilities", [False, True])
@pytest.mark.parametrize("overlap", [0, 32, 64, 128])
def test_auto_on_the_cpu_is_the_largest_cog_tile_multiple_whose_arrays_fit(
    num_classes: int, probabilities: bool, overlap: int
) -> None:
    layout = WindowLayout.over(4096, 4096, size=256, overlap=overlap)
    edge = _auto(num_classes, layout, probabilities=probabilities)
    assert edge % COG_BLOCK_PX == 0 and COG_BLOCK_PX <= edge <= BLOCK_AUTO_MAX_PX
    per_px = block_bytes_per_px(num_classes, layout, probabilities=probabilities)
    if edge > COG_BLOCK_PX:  # one tile is the floor, whatever it holds
        assert per_px * edge**2 <= BLOCK_AUTO_CPU_BYTES
    if edge < BLOCK_AUTO_MAX_PX:  # the next tile multiple would not fit
        assert per_px * (edge + COG_BLOCK_PX) ** 2 > BLOCK_AUTO_CPU_BYTES


def test_auto_follows_the_model_classes_window_overlap_and_probabilities() -> None:
    """Fewer classes, less overlap and no probabilities hold fewer bytes a pixel: a block
    at least as large; the registry's extremes get different edges."""
    wide = WindowLayout.over(4096, 4096, size=256, overlap=128)
    assert _auto(2) >= _auto(5) >= _auto(14)
    assert _auto(2) > _auto(14)
    assert _auto(5) >= _auto(5, wide)
    assert _auto(5) >= _auto(5, probabilities=True)
    assert block_bytes_per_px(5, wide, probabilities=False) > block_bytes_per_px(
        5, CHIP_LAYOUT, probabilities=False
    )
    assert block_bytes_per_px(5, CHIP_LAYOUT, probabilities=True) > block_bytes_per_px(
        5, CHIP_LAYOUT, probabilities=False
    )


def test_auto_on_a_gpu_is_the_device_edge() -> None:
    """On a GPU the block's arrays are in device memory, not the process's."""
    for num_classes in (2, 14):
        assert _auto(num_classes, on_cpu=False) == BLOCK_AUTO_DEVICE_PX
    assert _auto(14, on_cpu=False) != _auto(14, on_cpu=True)


def test_prepare_prediction_resolves_auto_once_for_every_reader(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    """The prepared config (which parts' and tiles' keys, rank shares and the schedule read)
    holds the resolved edge, the same one `resolve_block_px` gives for the model."""
    config = PredictConfig(str(constant_model), (str(scene),), str(tmp_path / "lc.tif"))
    assert config.block_px is None
    with pytest.raises(RuntimeError):
        config.resolved_block_px  # noqa: B018 (an unprepared config has no edge yet)
    prepared = prepare_prediction(config, torch.device("cpu"), max_pixels=None, quiet=True)
    chip = WindowLayout.over(
        prepared.grid.height,
        prepared.grid.width,
        size=prepared.meta.chip_size,
        overlap=prepared.layout.overlap,
    )
    expected = resolve_block_px(
        None, num_classes=prepared.meta.num_classes, layout=chip, probabilities=False, on_cpu=True
    )
    assert prepared.config.block_px == prepared.config.resolved_block_px == expected
    assert pixel_settings(prepared)["block_px"] == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("8", "error: --block-px 8 px: must be at least 16\n"),
        ("12x", "error: --block-px '12x': give auto or an edge in px\n"),
        ("", "error: --block-px '': give auto or an edge in px\n"),
    ],
)
def test_a_bad_block_edge_is_one_line(value: str, message: str) -> None:
    result = CliRunner().invoke(
        main, ["predict", "model.pt", "scene.tif", "--out", "lc.tif", "--block-px", value]
    )
    assert result.exit_code != 0
    assert result.stderr == message


def test_block_px_auto_is_the_default_and_px_are_accepted() -> None:
    for argv, expected in (([], None), (["--block-px", "auto"], None), (["--block-px", "64"], 64)):
        context = predict_command.make_context(
            "predict", ["m.pt", "s.tif", "--out", "o.tif", *argv]
        )
        assert context.params["block_px"] == expected
