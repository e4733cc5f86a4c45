"""The window runner's use of the CPU: its own array work on one thread, the model on the
threads the block started with."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from landcover.models.modelfile import ModelMeta
from landcover.prediction.blend import LogitBlender, WindowLayout, argmax_classes
from landcover.prediction.blocks import block_schedule
from landcover.prediction.blockstages import BlockPredictor, PreparedBlock
from landcover.prediction.gridwindow import Window
from landcover.prediction.windows import BlockPixels, WindowRunner
from tiling.classes import get_class_map

SIZE = 16


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_block_work_runs_on_one_thread_and_the_model_on_the_blocks_threads(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy CPU an OpenMP team waits at each barrier of a small elementwise operator far
    longer than the operator takes: cutting, normalising, blending and the argmax run on one
    thread, the model on the two the block started with, and torch has two again after."""
    seen: dict[str, set[int]] = {"model": set(), "blend": set(), "argmax": set()}

    class Recorder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["model"].add(torch.get_num_threads())
            return x[:, :1].repeat(1, 5, 1, 1)

    add = LogitBlender.add

    def recorded_add(self: LogitBlender, logits: torch.Tensor, row: int, col: int) -> None:
        seen["blend"].add(torch.get_num_threads())
        add(self, logits, row, col)

    def recorded_argmax(scores: torch.Tensor) -> torch.Tensor:
        seen["argmax"].add(torch.get_num_threads())
        return argmax_classes(scores)

    monkeypatch.setattr(LogitBlender, "add", recorded_add)
    monkeypatch.setattr("landcover.prediction.blockstages.argmax_classes", recorded_argmax)
    meta = ModelMeta(
        architecture="recorder",
        class_map=get_class_map("chesapeake7to5"),  # 5 codes
        band_names=("red", "green", "blue", "nir"),
        band_mean=(100.0,) * 4,
        band_std=(50.0,) * 4,
        chip_size=SIZE,
        resolution_m=1.0,
    )
    layout = WindowLayout.over(40, 40, size=SIZE, overlap=4)
    runner = WindowRunner(Recorder(), meta, layout, batch_size=3, where="m.pt", device="cpu")
    predictor = BlockPredictor(runner, 5, device=torch.device("cpu"), probabilities=False)
    (block,) = block_schedule(layout, Window(0, 0, 40, 40), 40)
    data = np.random.default_rng(0).integers(1, 255, (4, 40, 40), dtype=np.uint8)
    pixels = BlockPixels(data, np.ones((40, 40), bool), block.extent, block.window)
    todo = tuple((r, c) for r in block.rows for c in block.cols)
    predicted = predictor(PreparedBlock(block, pixels, np.ones((40, 40), bool), todo))
    assert predicted.classes is not None and predicted.classes.shape == (40, 40)
    assert seen == {"model": {2}, "blend": {1}, "argmax": {1}}
    assert torch.get_num_threads() == 2
