"""The logits of windows that reach past the block that ran them, kept for the blocks that
add them next, so that a window runs once in an area instead of once for every block it
touches.

Blocks come row by row, left to right (`landcover.prediction.blocks.block_schedule`). A window
that reaches into the next block of its block row is kept whole until that block has added
it; one that reaches into the next block ROW is kept for the blocks of that row, cut to the
rows it still covers there, within a budget of bytes (`CARRY_BELOW_BYTES`): a window past the
budget runs again in the next block row. Which windows are kept never changes a pixel: a
window's logits depend on its place in the grid only (the source pixels under it and the
model), and a block adds its windows in window order whether they were kept or run now.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from landcover.prediction.blend import WindowLayout
from landcover.prediction.gridwindow import Window

__all__ = ["CarriedLogits", "WindowLogits"]


@dataclass(frozen=True, slots=True)
class WindowLogits:
    """A window's logits from its row `first_row` down: (classes, size - first_row, size)."""

    logits: torch.Tensor
    first_row: int = 0


class CarriedLogits:
    """The window logits kept between the blocks of one area's schedule."""

    def __init__(self, layout: WindowLayout, *, below_budget_bytes: int) -> None:
        self.layout = layout
        self.below_budget_bytes = below_budget_bytes
        self._right: dict[tuple[int, int], WindowLogits] = {}  # into the next block of the row
        self._below: dict[tuple[int, int], WindowLogits] = {}  # into the next block row
        self._below_bytes = 0

    @property
    def below_bytes(self) -> int:
        """Bytes of the logits kept for the next block row."""
        return self._below_bytes

    def start_block_row(self, row: int) -> None:
        """A block row starting at grid row `row` begins: of the windows kept for it, those
        that reach across its top edge stay; nothing is kept from left to right."""
        self._right = {}
        size = self.layout.size
        self._below = {(r, c): kept for (r, c), kept in self._below.items() if r < row < r + size}
        self._below_bytes = sum(kept.logits.nbytes for kept in self._below.values())

    def take(self, todo: list[tuple[int, int]]) -> dict[tuple[int, int], WindowLogits]:
        """The kept logits of the windows `todo` of the next block; what was kept for that
        block alone is let go."""
        right, self._right = self._right, {}
        found: dict[tuple[int, int], WindowLogits] = {}
        for rc in todo:
            kept = right.get(rc) or self._below.get(rc)
            if kept is not None:
                found[rc] = kept
        return found

    def keep(self, rc: tuple[int, int], kept: WindowLogits, block: Window) -> None:
        """Keep the logits of window `rc`, added to `block`, for the blocks after it that it
        reaches into."""
        r, c = rc
        size = self.layout.size
        if c + size > block.col_stop and block.col_stop < self.layout.width:
            self._right[rc] = kept
        if r + size <= block.row_stop or block.row_stop >= self.layout.height:
            return
        first = block.row_stop - r  # the window's first row below this block row
        current = self._below.get(rc)
        if current is not None and current.first_row >= first:
            return  # kept already, for this block row's blocks further right
        rows = kept.logits[:, first - kept.first_row :, :]
        grown = rows.nbytes - (0 if current is None else current.logits.nbytes)
        if self._below_bytes + grown > self.below_budget_bytes:
            return  # past the budget: it runs again in the next block row
        self._below[rc] = WindowLogits(rows.clone(), first)
        self._below_bytes += grown
