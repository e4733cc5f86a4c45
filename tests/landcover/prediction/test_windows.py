"""The window runner's use of the CPU: its own array work on one thread, the model on the
threads the block started with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from landcover.models.modelfile import ModelMeta
from landcover.prediction.blend import LogitBlender, WindowLayout, argmax_classes
from landcover.prediction.blocks import block_schedule
from landcover.prediction.blockstages import BlockPredictor, PreparedBlock
from landcover.prediction.gridwindow import Window
from landcover.prediction.windows import BlockPixels, WindowRunner
from tiling.sources.classes import get_class_map

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


class _Onnx:
    """Stands for a model onnxruntime runs (no batch padding)."""

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels


def _choose(window: str, model: object, **kwargs: object) -> int:
    from landcover.prediction.windows import choose_window_px

    args: dict[str, object] = dict(chip_px=256, overlap_px=64, block_px=2048, grid_px=(7500, 6000))
    args.update(kwargs)
    return choose_window_px(window, model, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("window", "kwargs", "expected"),
    [
        ("chip", {}, 256),
        ("auto", {}, 512),  # a quarter of the 2048 px block
        ("auto", {"block_px": 4096}, 1024),  # 4 chips a side at most
        ("auto", {"block_px": 8192}, 1024),
        ("auto", {"grid_px": (300, 200)}, 512),  # two chips span the grid
        ("auto", {"grid_px": (100, 90)}, 256),
        ("auto", {"block_px": 512}, 256),  # never below the chip
        ("768", {}, 768),
        ("160", {}, 160),
    ],
)
def test_window_choices(window: str, kwargs: dict[str, object], expected: int) -> None:
    assert _choose(window, _Onnx(), **kwargs) == expected


def test_torch_on_the_cpu_runs_the_chip_under_auto_and_refuses_larger_windows() -> None:
    """torch pads a CPU batch to 16 windows: 16 windows of 1,024 px would be 16x the work and
    the memory of one."""
    from landcover.errors import PredictionError
    from landcover.prediction.runtime import TorchWindowModel

    model = TorchWindowModel(torch.nn.Identity(), device=torch.device("cpu"))
    assert _choose("auto", model) == 256
    assert _choose("chip", model) == 256
    assert _choose("160", model) == 160
    with pytest.raises(PredictionError, match=r"--window 512: .*--backend onnxruntime"):
        _choose("512", model)


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ("big", "--window 'big': give chip, auto or an edge in px"),
        ("0", "--window '0': give chip, auto or an edge in px"),
        ("500", r"--window 500: the edge must be a multiple of 32 px .*e.g. 512"),
    ],
)
def test_bad_window_values_are_refused_in_one_line(window: str, message: str) -> None:
    from landcover.errors import PredictionError

    with pytest.raises(PredictionError, match=message):
        _choose(window, _Onnx())


def test_a_window_no_larger_than_twice_the_overlap_is_refused() -> None:
    from landcover.errors import PredictionError

    with pytest.raises(PredictionError, match="--window 128: must be larger than twice"):
        _choose("128", _Onnx())


@pytest.mark.parametrize(
    ("window_px", "expected"), [(256, 16), (512, 4), (768, 1), (1024, 1), (128, 64)]
)
def test_a_batch_of_larger_windows_holds_as_many_pixels(window_px: int, expected: int) -> None:
    from landcover.prediction.windows import windows_per_batch

    assert windows_per_batch(16, 256, window_px) == expected


@pytest.mark.parametrize(
    ("provider", "window_px", "expected"),
    [
        ("CPUExecutionProvider", 256, 4),  # ONNX_CPU_BATCH_PIXELS: 4 windows of 256 px
        ("CPUExecutionProvider", 512, 1),
        ("CPUExecutionProvider", 1024, 1),
        ("CUDAExecutionProvider", 256, 16),  # a GPU takes the whole --batch-size
        ("CUDAExecutionProvider", 512, 4),
    ],
)
def test_onnxruntime_on_the_cpu_runs_small_batches(
    provider: str, window_px: int, expected: int
) -> None:
    """onnxruntime's CPU batches hold at most 4 windows of 256 px: as fast a pixel as 16,
    whose activations would hold 4x the memory."""
    from landcover.prediction.runtime import Inference, OnnxWindowModel

    model = OnnxWindowModel.__new__(OnnxWindowModel)  # no session: only what runs it
    model.inference = Inference("onnxruntime", "fp32", provider)
    meta = ModelMeta(
        architecture="small_unet",
        class_map=get_class_map("chesapeake7to5"),
        band_names=("red", "green", "blue", "nir"),
        band_mean=(100.0,) * 4,
        band_std=(50.0,) * 4,
        chip_size=256,
        resolution_m=1.0,
    )
    layout = WindowLayout.over(3000, 3000, size=window_px, overlap=64)
    runner = WindowRunner(model, meta, layout, batch_size=16, where="m.onnx", device="cpu")
    assert runner.batch_size == expected


def test_the_cli_refuses_a_bad_window_in_one_line(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from landcover.cli.app import main

    out = tmp_path / "lc.tif"
    args = ["predict", str(random_model), str(scene), "--out", str(out), "--window", "500"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    assert (
        result.output.strip()
        .splitlines()[-1]
        .endswith(
            "--window 500: the edge must be a multiple of 32 px (the models' stride), e.g. 512"
        )
    )
    assert "Traceback" not in result.output and not out.exists()
