"""Running the model over the windows of one output block.

`WindowRunner` cuts the windows out of a block's source pixels, normalises them as training
does (`landcover.data.normalise`), runs them in batches through a `WindowModel` (PyTorch or
onnxruntime, `landcover.prediction.runtime`), with test-time augmentation when asked
(`landcover.prediction.tta`), and hands their logits on in window order, for the block's
`LogitBlender` (`landcover.prediction.blockstages`). It keeps
the logits of windows that reach into the blocks after the one that ran them
(`landcover.prediction.carry`), so a window runs once in an area (those past the budget of
what is kept for the next block row run again). A block adds its windows' logits in window order,
whether they were kept or run now, so a pixel's sum comes out the same whichever schedule
(blocks, tiles of a tiled product, ranks) computes it; on the CPU the runtime makes a window's
logits independent of its batch (`landcover.prediction.runtime`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from landcover.data.normalise import normalise
from landcover.errors import PredictionError
from landcover.models.modelfile import ModelMeta
from landcover.models.smp_models import SMP_PREFIX
from landcover.prediction.blend import WindowLayout
from landcover.prediction.carry import CarriedLogits, WindowLogits
from landcover.prediction.choices import (
    CARRY_BELOW_BYTES,
    ONNX_CPU_BATCH_PIXELS,
    WINDOW_AUTO_MAX_CHIPS,
    WINDOW_OVERLAP_MARGIN_PX,
    WINDOW_OVERLAP_PX,
    WINDOW_SMP_OVERLAP_PX,
    overlap_choice_problem,
    window_choice_problem,
)
from landcover.prediction.gridwindow import Window
from landcover.prediction.runtime import (
    CPU_MIN_BATCH,
    OnnxWindowModel,
    TorchWindowModel,
    WindowModel,
    torch_threads,
)
from landcover.prediction.tta import average_over_symmetries


@dataclass(frozen=True, slots=True)
class BlockPixels:
    """Source pixels under all windows of one output block, and the block's place."""

    data: npt.NDArray[np.uint8]  # (bands, height, width) of `extent`
    covered: npt.NDArray[np.bool_]  # (height, width) of `extent`: pixels with data
    extent: Window  # the pixels under every window that touches the block
    block: Window  # the block's output pixels


class WindowRunner:
    """Runs windows in batches; keeps the logits of windows that reach into later blocks
    (`CarriedLogits`), so that a window runs once in an area, within CARRY_BELOW_BYTES of the
    logits kept for the next block row."""

    def __init__(
        self,
        model: WindowModel,
        meta: ModelMeta,
        layout: WindowLayout,
        *,
        batch_size: int,
        where: str,
        device: torch.device | str,
        tta_ops: Sequence[int] = (0,),
    ) -> None:
        """`where` names the model file in errors about the model's output; `tta_ops` are the
        dihedral ops whose passes are averaged (`landcover.prediction.tta`)."""
        self.model, self.layout, self.device = model, layout, torch.device(device)
        self.tta_ops = tuple(tta_ops)
        self.num_classes = meta.num_classes
        self.batch_size = windows_per_batch(
            batch_size, meta.chip_size, layout.size, max_pixels=_batch_pixels_limit(model)
        )
        self.where = where
        self.mean = torch.tensor(meta.band_mean, dtype=torch.float32, device=self.device).view(
            1, -1, 1, 1
        )
        self.std = torch.tensor(meta.band_std, dtype=torch.float32, device=self.device).view(
            1, -1, 1, 1
        )
        self.carried = CarriedLogits(layout, below_budget_bytes=CARRY_BELOW_BYTES)
        self.windows_run = 0
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # `_batch_buffers`

    def new_block_row(self, row: int) -> None:
        """The next block starts a new block row, at grid row `row`."""
        self.carried.start_block_row(row)

    def run(
        self,
        block: BlockPixels,
        todo: Sequence[tuple[int, int]],
        *,
        model_threads: int | None = None,
    ) -> list[tuple[tuple[int, int], WindowLogits]]:
        """The logits of the windows `todo` (top-left row, col), kept or run now, in window
        order: the order a block adds them in (`LogitBlender.add`), whichever block, tile or
        rank computes a pixel's sum.

        On the CPU the windows are cut and normalised on one thread, and the model runs on
        `model_threads` (None: torch's count now; `runtime.torch_threads`)."""
        threads = torch.get_num_threads() if model_threads is None else model_threads
        own_threads: AbstractContextManager[Any] = (
            torch_threads(1) if self.device.type == "cpu" else nullcontext()
        )
        with own_threads:
            return self._run(block, todo, threads)

    def _run(
        self,
        block: BlockPixels,
        todo: Sequence[tuple[int, int]],
        model_threads: int,
    ) -> list[tuple[tuple[int, int], WindowLogits]]:
        size = self.layout.size
        ext_row0, ext_col0 = block.extent.row, block.extent.col
        carried = self.carried.take(list(todo))
        fresh = [rc for rc in todo if rc not in carried]
        pixels = torch.from_numpy(block.data).to(self.device)
        has_data = torch.from_numpy(block.covered).to(self.device)
        # Where the imagery covers the whole block's extent (most blocks), no window needs
        # its pixels without data set to the band mean.
        all_covered = bool(block.covered.all())
        results: list[tuple[tuple[int, int], WindowLogits]] = list(carried.items())
        for batch in _batches(fresh, self.batch_size):
            x, valid = self._batch_buffers(len(batch), pixels.shape[0])
            for k, (r, c) in enumerate(batch):
                rows = slice(r - ext_row0, r - ext_row0 + size)
                cols = slice(c - ext_col0, c - ext_col0 + size)
                x[k].copy_(pixels[:, rows, cols])  # uint8 to float32 in the copy
                if not all_covered:
                    valid[k].copy_(has_data[rows, cols])
            # As in training: pixels no source covers get the band mean (0 after normalising).
            x = normalise(x, self.mean, self.std, valid=True if all_covered else valid)
            with torch_threads(model_threads):
                logits = average_over_symmetries(self._model_pass, x, self.tta_ops)
            results.extend((rc, WindowLogits(lg)) for rc, lg in zip(batch, logits, strict=True))
            self.windows_run += len(batch)
        # Window order, not schedule order: a pixel's sum of weighted logits is then added up
        # in the same order whichever block, tile or rank computes it.
        results.sort(key=lambda item: item[0])
        for rc, kept in results:
            self.carried.keep(rc, kept, block.block)
        return results

    def _batch_buffers(self, count: int, bands: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` windows of the batch buffers (pixels as float32, validity), made
        once: a batch is cut into the same memory every time instead of new tensors."""
        size = self.layout.size
        if self._buffers is None or self._buffers[0].shape[1] != bands:
            self._buffers = (
                torch.empty(
                    (self.batch_size, bands, size, size), dtype=torch.float32, device=self.device
                ),
                torch.empty((self.batch_size, size, size), dtype=torch.bool, device=self.device),
            )
        pixels, valid = self._buffers
        return pixels[:count], valid[:count]

    def _model_pass(self, x: torch.Tensor) -> torch.Tensor:
        return _run_model(self.model, x, self.num_classes, self.where)


def choose_window_px(
    window: str,
    model: WindowModel,
    *,
    chip_px: int,
    overlap_px: int | None,
    architecture: str,
    grid_px: tuple[int, int],
) -> int:
    """The model's window edge in px for `--window` (`landcover.prediction.choices`), alike
    on every rank, tile and task of a prediction (it depends on the whole grid, not a share):

    - `chip`: the model's chip;
    - `auto`: of the multiples of the chip up to WINDOW_AUTO_MAX_CHIPS chips a side, no larger
      than the grid needs and, where onnxruntime runs on the CPU, no larger than one batch
      (ONNX_CPU_BATCH_PIXELS: a window's activations are most of a prediction's memory), the
      one that computes the fewest window pixels over the grid (`window_pixels_per_px`: the
      overlap, `choose_overlap_px` at that window, and the windows flush with the grid's
      end); the smaller on a tie. The chip where torch runs the model on
      the CPU, whose batches are padded to CPU_MIN_BATCH windows;
    - an edge in px, larger than twice an explicit `overlap_px` (None: `--overlap auto`, which
      fits itself to the window); refused (`PredictionError`) where torch runs the model on
      the CPU and it is larger than the chip, for that padding.

    A batch then holds as many pixels as `--batch-size` chips (`windows_per_batch`)."""
    problem = window_choice_problem(window)
    if problem is not None:
        raise PredictionError(problem)
    padded = isinstance(model, TorchWindowModel) and model.device.type == "cpu"
    if window == "chip" or (window == "auto" and padded):
        return chip_px
    if window == "auto":
        needed = -(-max(grid_px) // chip_px)  # chips that span the grid's longer side
        chips = min(WINDOW_AUTO_MAX_CHIPS, needed)
        limit = _batch_pixels_limit(model)
        if limit is not None:
            chips = min(chips, math.isqrt(limit) // chip_px)
        sizes = [k * chip_px for k in range(1, max(1, chips) + 1)]
        if overlap_px is not None:  # an explicit overlap must fit the window
            sizes = [size for size in sizes if size > 2 * overlap_px] or [chip_px]

        def cost(size: int) -> tuple[float, int]:
            overlap = choose_overlap_px(overlap_px, architecture, chip_px=chip_px, window_px=size)
            return window_pixels_per_px(grid_px, size, overlap), size

        return min(sizes, key=cost)
    size = int(window)
    if overlap_px is not None and size <= 2 * overlap_px:
        raise PredictionError(
            f"--window {size}: must be larger than twice the overlap ({overlap_px} px); give "
            f"a larger window or a smaller --overlap"
        )
    if padded and size > chip_px:
        raise PredictionError(
            f"--window {size}: torch runs batches of at least {CPU_MIN_BATCH} windows on the "
            f"CPU (so that the map does not depend on the thread count); run windows larger "
            f"than the model's {chip_px} px chip with --backend onnxruntime, or use --window chip"
        )
    return size


def window_pixels_per_px(grid_px: tuple[int, int], window_px: int, overlap_px: int) -> float:
    """Window pixels the model computes per pixel of a `grid_px` (height, width) grid: each
    window of its layout once (the blocks keep the logits of the windows they share,
    `landcover.prediction.carry`)."""
    height, width = grid_px
    if window_px <= 2 * overlap_px:
        return math.inf
    layout = WindowLayout.over(height, width, size=window_px, overlap=overlap_px)
    return layout.num_windows * window_px * window_px / (height * width)


def choose_overlap_px(
    overlap_px: int | None, architecture: str, *, chip_px: int, window_px: int
) -> int:
    """The overlap of neighbouring windows in px for `--overlap` (None: `auto`), alike on
    every rank, tile and task (it depends on the model and the window only):

    - `auto`: what the model's architecture needs (`model_overlap_px`), at most half the
      window less WINDOW_OVERLAP_MARGIN_PX (torch on the CPU runs the chip);
    - px: as given, 0 or more and at most half the window, else `PredictionError`."""
    problem = overlap_choice_problem(overlap_px)
    if problem is not None:
        raise PredictionError(problem)
    if overlap_px is not None:
        if 2 * overlap_px > window_px:
            raise PredictionError(
                f"--overlap {overlap_px}: must be at most half the {window_px} px window; "
                "give a smaller --overlap (or auto), or a larger --window"
            )
        return overlap_px
    wanted = model_overlap_px(architecture, chip_px=chip_px)
    return max(0, min(wanted, window_px // 2 - WINDOW_OVERLAP_MARGIN_PX))


def model_overlap_px(architecture: str, *, chip_px: int) -> int:
    """The overlap a model file's architecture needs for seamless maps, in px:
    WINDOW_OVERLAP_PX, WINDOW_SMP_OVERLAP_PX for `smp:ARCH:ENCODER`, else a quarter of the
    chip."""
    if architecture.startswith(SMP_PREFIX):
        return WINDOW_SMP_OVERLAP_PX
    return WINDOW_OVERLAP_PX.get(architecture, chip_px // 4)


def windows_per_batch(
    batch_size: int, chip_px: int, window_px: int, *, max_pixels: int | None = None
) -> int:
    """Windows of `window_px` in a batch of as many pixels as `batch_size` chips, and of at
    most `max_pixels` (None: no limit); at least 1. The model's activations, most of a
    prediction's memory, grow with a batch's pixels, whatever the window."""
    count = batch_size * chip_px * chip_px // (window_px * window_px)
    if max_pixels is not None:
        count = min(count, max_pixels // (window_px * window_px))
    return max(1, count)


def _batch_pixels_limit(model: WindowModel) -> int | None:
    """The most pixels a batch of `model` needs: ONNX_CPU_BATCH_PIXELS for onnxruntime on the
    CPU (as fast a pixel, at a quarter of the memory of 16 windows); None for torch (on the
    CPU its batches are padded to CPU_MIN_BATCH windows anyway) and for a GPU."""
    if isinstance(model, OnnxWindowModel) and model.inference.provider == "CPUExecutionProvider":
        return ONNX_CPU_BATCH_PIXELS
    return None


def _run_model(model: WindowModel, x: torch.Tensor, num_classes: int, where: str) -> torch.Tensor:
    logits = model(x)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 4 or logits.shape[1] != num_classes:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise PredictionError(
            f"{where}: model returned {shape} for {tuple(x.shape)} input; expected "
            f"{num_classes} class channels as its class table says"
        )
    if logits.shape[-2:] != x.shape[-2:]:
        raise PredictionError(
            f"{where}: model output is {tuple(logits.shape[-2:])} px for a "
            f"{tuple(x.shape[-2:])} px window; it must keep the input size"
        )
    return logits.float()


def _batches(items: list[tuple[int, int]], size: int) -> Iterator[list[tuple[int, int]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
