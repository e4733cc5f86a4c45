"""Sliding windows over a grid and the smooth blending of their overlapping logits.

Windows of `size` pixels step by `size - overlap`; the last window on each axis is placed
flush with the grid's end, so every pixel is covered and no window hangs over the edge
(unless the grid is smaller than one window). Each window's logits are weighted by a
separable profile that ramps up over the overlap as sin² and down as cos², so on a regular
stride the weights of neighbouring windows add up to exactly one; the accumulated weighted
sum is divided by the accumulated weight in any case. A side that touches the grid's edge is
not tapered (no window continues it), so the weight is positive everywhere.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch

from landcover.prediction.gridwindow import Window


def window_starts(length: int, size: int, overlap: int) -> tuple[int, ...]:
    """Start offsets of windows covering [0, length): stride size-overlap, last one flush."""
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"window size {size} with overlap {overlap}: need 0 <= overlap < size")
    if length <= size:
        return (0,)
    stride = size - overlap
    starts = list(range(0, length - size, stride))
    starts.append(length - size)
    return tuple(starts)


def taper_profile(
    size: int, overlap: int, *, taper_start: bool, taper_end: bool
) -> npt.NDArray[np.float32]:
    """1-D weights: sin² ramp over the first `overlap` px, cos² over the last, 1 between."""
    profile = np.ones(size, dtype=np.float64)
    if overlap > 0:
        t = (np.arange(overlap, dtype=np.float64) + 0.5) / overlap
        ramp = np.sin(0.5 * math.pi * t) ** 2
        if taper_start:
            profile[:overlap] = np.minimum(profile[:overlap], ramp)
        if taper_end:
            profile[size - overlap :] = np.minimum(profile[size - overlap :], ramp[::-1])
    return profile.astype(np.float32)


@dataclass(frozen=True, slots=True)
class WindowLayout:
    """All windows over a `height` x `width` grid."""

    height: int
    width: int
    size: int
    overlap: int
    row_starts: tuple[int, ...]
    col_starts: tuple[int, ...]

    @classmethod
    def over(cls, height: int, width: int, *, size: int, overlap: int) -> WindowLayout:
        return cls(
            height,
            width,
            size,
            overlap,
            window_starts(height, size, overlap),
            window_starts(width, size, overlap),
        )

    @property
    def num_windows(self) -> int:
        return len(self.row_starts) * len(self.col_starts)

    def rows_touching(self, start: int, stop: int) -> tuple[int, ...]:
        """Row starts of windows that overlap grid rows [start, stop)."""
        return _touching(self.row_starts, self.size, start, stop)

    def cols_touching(self, start: int, stop: int) -> tuple[int, ...]:
        return _touching(self.col_starts, self.size, start, stop)

    def weight(self, row_start: int, col_start: int) -> npt.NDArray[np.float32]:
        """(size, size) blending weight of the window at (row_start, col_start)."""
        return _weight(*self.weight_key(row_start, col_start))

    def weight_key(self, row_start: int, col_start: int) -> tuple[int, int, bool, bool, bool, bool]:
        """What the weight depends on: size, overlap and which sides are tapered."""
        return (
            self.size,
            self.overlap,
            row_start > 0,
            row_start + self.size < self.height,
            col_start > 0,
            col_start + self.size < self.width,
        )


@lru_cache(maxsize=16)
def _weight(
    size: int, overlap: int, top: bool, bottom: bool, left: bool, right: bool
) -> npt.NDArray[np.float32]:
    rows = taper_profile(size, overlap, taper_start=top, taper_end=bottom)
    cols = taper_profile(size, overlap, taper_start=left, taper_end=right)
    weight = np.outer(rows, cols).astype(np.float32)
    weight.flags.writeable = False
    return weight


def _touching(starts: tuple[int, ...], size: int, start: int, stop: int) -> tuple[int, ...]:
    # starts is sorted; a window [s, s+size) touches [start, stop) when s < stop and s+size > start
    lo = bisect.bisect_right(starts, start - size)
    hi = bisect.bisect_left(starts, stop)
    return starts[lo:hi]


class LogitBlender:
    """Weighted sum of window logits over one block of the grid, and of their weights.

    A pixel's weighted sum is added up with one rounding per window (a fused multiply-add).
    Its argmax is the argmax of the weighted mean (the weights are positive): a class map
    alone needs no division, nor the sum of the weights (`mean=False`)."""

    def __init__(
        self,
        layout: WindowLayout,
        num_classes: int,
        block: Window,
        *,
        device: torch.device | str = "cpu",
        mean: bool = True,
    ) -> None:
        """`mean`: also sum the weights, for `blended` (the weighted mean)."""
        self.layout, self.block = layout, block
        self.device = torch.device(device)
        self.total = torch.zeros(
            (num_classes, block.height, block.width), dtype=torch.float32, device=self.device
        )
        self.weight = (
            torch.zeros((block.height, block.width), dtype=torch.float32, device=self.device)
            if mean
            else None
        )
        self._weights: dict[tuple[int, int, bool, bool, bool, bool], torch.Tensor] = {}
        self._done = False  # `blended` has divided the sums in place

    def add(
        self, logits: torch.Tensor, row_start: int, col_start: int, *, first_row: int = 0
    ) -> None:
        """Add one window's logits, placed at grid (row_start, col_start): (classes, size,
        size), or the window's rows from `first_row` down (what `landcover.prediction.carry`
        keeps for the next block row)."""
        if self._done:
            raise RuntimeError("LogitBlender.add: called after `blended` divided the sums")
        rows_held, size_c = logits.shape[-2:]
        block = self.block
        r0 = max(row_start + first_row, block.row)
        r1 = min(row_start + first_row + rows_held, block.row_stop)
        c0, c1 = max(col_start, block.col), min(col_start + size_c, block.col_stop)
        if r0 >= r1 or c0 >= c1:
            return
        w = self._device_weight(self.layout.weight_key(row_start, col_start))
        cols = slice(c0 - col_start, c1 - col_start)
        w_part = w[r0 - row_start : r1 - row_start, cols]
        held = logits[:, r0 - row_start - first_row : r1 - row_start - first_row, cols]
        dst = (slice(r0 - block.row, r1 - block.row), slice(c0 - block.col, c1 - block.col))
        self.total[:, dst[0], dst[1]].addcmul_(held, w_part)
        if self.weight is not None:
            self.weight[dst].add_(w_part)

    def sums(self, first: int = 0) -> torch.Tensor:
        """(classes - first, height, width) weighted sums of the logits of classes `first`
        and up, a view (0 where no window added): their argmax is the weighted mean's."""
        if self._done:
            raise RuntimeError("LogitBlender.sums: called after `blended` divided the sums")
        return self.total[first:]

    def blended(self, first: int = 0) -> torch.Tensor:
        """(classes - first, height, width) weighted mean of the logits of classes `first`
        and up; 0 where no window added.

        Divides the sums in place and returns a view of them (no block-sized copy): the
        blender is done, and a second call, or an `add` or `sums` after it, is refused
        (RuntimeError, a bug), as is a blender made with `mean=False`."""
        if self._done or self.weight is None:
            raise RuntimeError("LogitBlender.blended: divided already, or made without weights")
        self._done = True
        self.weight.clamp_min_(1e-12)
        return self.total[first:].div_(self.weight)

    def _device_weight(self, key: tuple[int, int, bool, bool, bool, bool]) -> torch.Tensor:
        cached = self._weights.get(key)
        if cached is None:
            cached = torch.from_numpy(np.array(_weight(*key))).to(self.device)
            self._weights[key] = cached
        return cached


def class_probabilities(scores: torch.Tensor) -> torch.Tensor:
    """`torch.softmax(scores, dim=0)` of (classes, height, width) scores, taken in
    whole-plane elementwise steps (the maximum, each class's exponential, their sum in class
    order, the quotients), so that a pixel's probabilities do not depend on how torch shares
    the planes out among threads: the last bits of torch's softmax over the outer dimension
    change with the thread count, and a rank with its share of the cores would round
    another probability than one process with all of them."""
    top = scores[0].clone()
    for c in range(1, scores.shape[0]):
        torch.maximum(top, scores[c], out=top)
    exps = (scores - top).exp_()
    total = exps[0].clone()
    for c in range(1, scores.shape[0]):
        total.add_(exps[c])
    return exps.div_(total)


def argmax_classes(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(dim=0)` of (classes, height, width) scores, as uint8 (< 256 classes).

    The same result, ties (the first class) and NaN (the first NaN wins, as for torch's)
    included, but taken as a running maximum over the classes in whole-plane elementwise
    steps: on CPU, torch's reduction over the outer dimension is several times slower, a
    noticeable share of a small model's forward pass over the same pixels. Scores without
    NaN (a sound model's; told by their sum, which is NaN when any score is) take three
    vectorised steps a class: where class c wins, the code so far is below c, so the new code
    is the larger of the two (no masked write, which torch runs element by element).
    """
    codes = torch.zeros(scores.shape[1:], dtype=torch.uint8, device=scores.device)
    best = scores[0].clone()
    if not bool(torch.isnan(scores.sum())):
        wins = torch.empty(scores.shape[1:], dtype=torch.bool, device=scores.device)
        for c in range(1, scores.shape[0]):
            plane = scores[c]
            torch.gt(plane, best, out=wins)
            torch.maximum(best, plane, out=best)
            torch.maximum(codes, wins.to(torch.uint8).mul_(c), out=codes)
        return codes
    best_nan = torch.isnan(best)
    for c in range(1, scores.shape[0]):
        plane = scores[c]
        plane_nan = torch.isnan(plane)
        wins = (plane > best) | (plane_nan & ~best_nan)
        best = torch.where(wins, plane, best)
        best_nan |= plane_nan
        codes.masked_fill_(wins, c)
    return codes
