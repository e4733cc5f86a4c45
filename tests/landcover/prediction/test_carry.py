"""The logits kept between blocks (landcover.prediction.carry): which windows are kept for
which blocks, the budget for the next block row, and a prediction that runs each window once
and writes the bytes of one that runs the windows of every block row afresh."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from landcover.prediction.blend import LogitBlender, WindowLayout
from landcover.prediction.carry import CarriedLogits, WindowLogits
from landcover.prediction.gridwindow import Window
from landcover.prediction.runner import predict_region
from tests.support.prediction import config_for

CLASSES = 3


def logits(size: int, value: float = 1.0) -> WindowLogits:
    return WindowLogits(torch.full((CLASSES, size, size), value))


def test_a_window_is_kept_for_the_next_block_of_its_row_and_cut_for_the_next_row() -> None:
    layout = WindowLayout.over(100, 100, size=32, overlap=8)  # starts 0, 24, 48, 68
    carried = CarriedLogits(layout, below_budget_bytes=10**9)
    block = Window(0, 0, 40, 40)
    carried.start_block_row(0)
    assert carried.take([(24, 24)]) == {}
    kept = logits(32)
    carried.keep((24, 24), kept, block)  # reaches right (to 56) and down (to 56)

    right = carried.take([(24, 24)])  # the next block of the row: the whole window
    assert right[(24, 24)] is kept
    carried.start_block_row(40)
    below = carried.take([(24, 24)])[(24, 24)]
    assert below.first_row == 16 and tuple(below.logits.shape) == (CLASSES, 16, 32)
    assert carried.below_bytes == below.logits.nbytes
    carried.start_block_row(80)  # the window ends at 56: nothing kept reaches row 80
    assert carried.take([(24, 24)]) == {} and carried.below_bytes == 0


def test_nothing_is_kept_past_the_grid_or_the_budget() -> None:
    layout = WindowLayout.over(64, 100, size=32, overlap=8)
    window_bytes = CLASSES * 16 * 32 * 4  # the 16 rows a window keeps for the next block row
    carried = CarriedLogits(layout, below_budget_bytes=window_bytes)
    carried.start_block_row(0)
    block = Window(0, 0, 40, 100)
    carried.keep((24, 0), logits(32), block)
    carried.keep((24, 24), logits(32), block)  # past the budget: runs again below
    carried.start_block_row(40)
    assert set(carried.take([(24, 0), (24, 24)])) == {(24, 0)}
    assert carried.below_bytes == window_bytes
    last = Window(40, 0, 24, 100)  # the grid's last block row: nothing kept below it
    carried.keep((40, 0), logits(32), last)
    assert carried.below_bytes == window_bytes


def test_a_kept_window_cut_to_its_lower_rows_blends_as_the_whole_window() -> None:
    layout = WindowLayout.over(100, 100, size=32, overlap=8)
    whole = torch.randn(CLASSES, 32, 32)
    block = Window(40, 0, 40, 40)
    one, other = (LogitBlender(layout, CLASSES, block) for _ in range(2))
    one.add(whole, 24, 24)
    other.add(whole[:, 16:].clone(), 24, 24, first_row=16)
    assert torch.equal(one.total, other.total) and torch.equal(one.weight, other.weight)


@pytest.mark.parametrize("block_px", [16, 40])
def test_kept_windows_run_once_and_write_the_bytes_of_windows_run_afresh(
    scene: Path,
    random_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    block_px: int,
) -> None:
    """With nothing kept for the next block row, the windows across each block row's top
    edge run again: the same bytes, more windows (16 px blocks: windows span several rows)."""
    options = {"block_px": block_px, "batch_size": 3, "window": "chip"}
    kept = predict_region(config_for(random_model, scene, tmp_path / "kept.tif", **options))
    monkeypatch.setattr("landcover.prediction.windows.CARRY_BELOW_BYTES", 0)
    again = predict_region(config_for(random_model, scene, tmp_path / "again.tif", **options))
    assert (tmp_path / "kept.tif").read_bytes() == (tmp_path / "again.tif").read_bytes()
    assert again.windows > kept.windows
    # 75 x 90 px in 32 px windows at the default overlap of small_unet's 32 px chip: each once
    layout_windows = predict_region(
        config_for(random_model, scene, tmp_path / "whole.tif", **{**options, "block_px": 4096})
    ).windows
    assert kept.windows == layout_windows
