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
from landcover.prediction.blockstages import BlockBlender, BlockRunner, PreparedBlock
from landcover.prediction.gridwindow import Window
from landcover.prediction.windows import BlockPixels, WindowRunner, window_pixels_per_px
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

    def recorded_add(
        self: LogitBlender, logits: torch.Tensor, row: int, col: int, *, first_row: int = 0
    ) -> None:
        seen["blend"].add(torch.get_num_threads())
        add(self, logits, row, col, first_row=first_row)

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
    run_block = BlockRunner(runner)
    blend_block = BlockBlender(layout, 5, device=torch.device("cpu"), probabilities=False)
    (block,) = block_schedule(layout, Window(0, 0, 40, 40), 40)
    data = np.random.default_rng(0).integers(1, 255, (4, 40, 40), dtype=np.uint8)
    pixels = BlockPixels(data, np.ones((40, 40), bool), block.extent, block.window)
    todo = tuple((r, c) for r in block.rows for c in block.cols)
    ran = run_block(PreparedBlock(block, pixels, np.ones((40, 40), bool), todo))
    assert torch.get_num_threads() == 2
    predicted = blend_block(ran)
    assert predicted.classes is not None and predicted.classes.shape == (40, 40)
    assert seen == {"model": {2}, "blend": {1}, "argmax": {1}}
    assert torch.get_num_threads() == 2


class _Onnx:
    """Stands for a model onnxruntime runs (no batch padding)."""

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels


def _choose(window: str, model: object, **kwargs: object) -> int:
    from landcover.prediction.windows import choose_window_px

    args: dict[str, object] = dict(
        chip_px=256,
        overlap_px=64,
        architecture="small_unet",
        grid_px=(7500, 6000),
    )
    args.update(kwargs)
    return choose_window_px(window, model, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("window", "kwargs", "expected"),
    [
        ("chip", {}, 256),
        ("auto", {"grid_px": (100, 90)}, 256),  # one chip spans the grid
        ("768", {}, 768),
        ("160", {}, 160),
    ],
)
def test_window_choices(window: str, kwargs: dict[str, object], expected: int) -> None:
    assert _choose(window, _Onnx(), **kwargs) == expected


@pytest.mark.parametrize("architecture", ["small_unet", "unet_resnet18"])
@pytest.mark.parametrize("overlap_px", [None, 32])
@pytest.mark.parametrize("grid_px", [(300, 200), (4096, 4096), (7500, 6000), (60000, 50000)])
def test_auto_takes_the_window_that_computes_the_fewest_pixels(
    architecture: str, overlap_px: int | None, grid_px: tuple[int, int]
) -> None:
    """The documented rule: of the multiples of the chip up to WINDOW_AUTO_MAX_CHIPS (and no
    more chips than span the grid), the one with the fewest window pixels per map pixel at its
    overlap, the smaller on a tie."""
    from landcover.prediction.choices import WINDOW_AUTO_MAX_CHIPS
    from landcover.prediction.windows import choose_overlap_px, window_pixels_per_px

    chosen = _choose(
        "auto",
        _Onnx(),
        architecture=architecture,
        overlap_px=overlap_px,
        grid_px=grid_px,
    )
    spanning = -(-max(grid_px) // 256)
    sizes = [k * 256 for k in range(1, min(WINDOW_AUTO_MAX_CHIPS, spanning) + 1)]
    assert chosen in sizes

    def cost(size: int) -> float:
        overlap = choose_overlap_px(overlap_px, architecture, chip_px=256, window_px=size)
        return window_pixels_per_px(grid_px, size, overlap)

    assert all(cost(chosen) < cost(size) for size in sizes if size < chosen)
    assert all(cost(chosen) <= cost(size) for size in sizes)


@pytest.mark.parametrize(("size", "overlap", "block"), [(256, 64, 2048), (512, 128, 1024)])
def test_window_pixels_per_px_counts_each_window_the_blocks_touch_once(
    size: int, overlap: int, block: int
) -> None:
    """The windows the blocks of a schedule touch, each once (the blocks keep the logits of
    the windows they share: test_carry.py runs a prediction that way)."""
    height, width = 3000, 2500
    layout = WindowLayout.over(height, width, size=size, overlap=overlap)
    schedule = block_schedule(layout, Window(0, 0, height, width), block)
    touched = {(r, c) for b in schedule for r in b.rows for c in b.cols}
    assert len(touched) == layout.num_windows
    expected = len(touched) * size * size / (height * width)
    assert window_pixels_per_px((height, width), size, overlap) == pytest.approx(expected)


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


def _onnx_cpu() -> object:
    """An onnxruntime model on the CPU (no session: only what runs it)."""
    from landcover.prediction.runtime import Inference, OnnxWindowModel

    model = OnnxWindowModel.__new__(OnnxWindowModel)
    model.inference = Inference("onnxruntime", "fp32", "CPUExecutionProvider")
    return model


@pytest.mark.parametrize("grid_px", [(4096, 4096), (7500, 6000), (60000, 50000)])
def test_auto_windows_of_onnxruntime_on_the_cpu_hold_at_most_one_batch(
    grid_px: tuple[int, int],
) -> None:
    """A window's activations are most of a prediction's memory: `auto` never takes a window
    of more pixels than onnxruntime's CPU batch, whatever the grid."""
    import math

    from landcover.prediction.choices import ONNX_CPU_BATCH_PIXELS

    window = _choose("auto", _onnx_cpu(), grid_px=grid_px, overlap_px=None)
    assert window * window <= ONNX_CPU_BATCH_PIXELS
    assert window <= math.isqrt(ONNX_CPU_BATCH_PIXELS)


@pytest.mark.parametrize(
    "architecture", ["small_unet", "unet_resnet18", "unet_resnet50", "smp:Unet:resnet18"]
)
@pytest.mark.parametrize("window_px", [32, 64, 256, 512, 1024])
def test_auto_overlap_is_the_models_need_within_half_the_window(
    architecture: str, window_px: int
) -> None:
    """The documented rule: the overlap recorded for the architecture (an smp model's for
    `smp:`), at most half the window less WINDOW_OVERLAP_MARGIN_PX."""
    from landcover.prediction.choices import (
        WINDOW_OVERLAP_MARGIN_PX,
        WINDOW_OVERLAP_PX,
        WINDOW_SMP_OVERLAP_PX,
    )
    from landcover.prediction.windows import choose_overlap_px

    wanted = WINDOW_OVERLAP_PX.get(architecture, WINDOW_SMP_OVERLAP_PX)
    overlap = choose_overlap_px(None, architecture, chip_px=256, window_px=window_px)
    assert overlap == min(wanted, window_px // 2 - WINDOW_OVERLAP_MARGIN_PX)
    assert 0 <= 2 * overlap < window_px
    if window_px >= 2 * (wanted + WINDOW_OVERLAP_MARGIN_PX):
        assert overlap == wanted  # the window holds what the model needs


def test_deeper_models_overlap_more_and_unrecorded_ones_a_quarter_chip() -> None:
    from landcover.prediction.windows import choose_overlap_px

    def auto(architecture: str) -> int:
        return choose_overlap_px(None, architecture, chip_px=256, window_px=1024)

    assert auto("unet_resnet18") > auto("small_unet") > 0
    assert auto("smp:Unet:resnet18") == auto("unet_resnet18")
    assert auto("deeplabv3_resnet50") == 256 // 4


@pytest.mark.parametrize("overlap", [0, 16, 128, 160, 256])
def test_an_explicit_overlap_is_at_most_half_the_window(overlap: int) -> None:
    """px are taken as given, larger than half the chip too where the window holds them (the
    overlap was bounded by the chip before --overlap auto); more than half the window is
    refused in one line."""
    from landcover.errors import PredictionError
    from landcover.prediction.windows import choose_overlap_px

    assert choose_overlap_px(overlap, "unet_resnet18", chip_px=256, window_px=512) == overlap
    assert choose_overlap_px(overlap, "small_unet", chip_px=32, window_px=2 * overlap) == overlap
    if overlap > 0:
        with pytest.raises(PredictionError, match=rf"--overlap {overlap}: must be at most half"):
            choose_overlap_px(overlap, "unet_resnet18", chip_px=256, window_px=2 * overlap - 1)


def test_the_same_auto_overlap_on_every_share_of_a_prediction() -> None:
    """`auto` depends on the model and the window only, never on a block, tile or rank."""
    from landcover.prediction.windows import choose_overlap_px

    values = {
        choose_overlap_px(None, "unet_resnet18", chip_px=256, window_px=512) for _ in range(3)
    }
    assert len(values) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "Invalid value for '--overlap': 'x': give auto or an overlap in px"),
        ("-8", "Invalid value for '--overlap': '-8': give auto or an overlap in px"),
        ("1.5", "Invalid value for '--overlap': '1.5': give auto or an overlap in px"),
    ],
)
def test_the_cli_refuses_a_bad_overlap_in_one_line(
    value: str, message: str, random_model: Path, scene: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from landcover.cli.app import main

    out = tmp_path / "lc.tif"
    args = ["predict", str(random_model), str(scene), "--out", str(out), "--overlap", value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    assert message in result.output.strip().splitlines()[-1]
    assert "Traceback" not in result.output and not out.exists()


def test_a_negative_overlap_is_refused_where_the_config_is_built() -> None:
    from landcover.errors import PredictionError
    from landcover.prediction.config import PredictConfig

    with pytest.raises(PredictionError, match=r"^--overlap -1: give auto or an overlap of 0 px"):
        PredictConfig("m.pt", ("a.tif",), "lc.tif", overlap_px=-1)
