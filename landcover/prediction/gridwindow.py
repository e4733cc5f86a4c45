"""Rectangles of the output grid in pixels: the `Window` value type and its arithmetic (block
cutting, margins, slices relative to another window), and the conversion to rasterio's
window at the one place prediction hands a rectangle to rasterio.

A `Window` is (row, col, height, width) in pixels of the output grid; it may reach past the
grid (the pixels under the model windows at its edges). Blocks, tiles, rank shares, the
source pixels under a block's model windows: each is a `Window`, so no code passes four
loose integers around and no two places cut a rectangle into blocks their own way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import rasterio.windows

__all__ = ["Window"]


@dataclass(frozen=True, slots=True)
class Window:
    """Rows [row, row + height) and columns [col, col + width) of the output grid."""

    row: int
    col: int
    height: int
    width: int

    def __iter__(self) -> Iterator[int]:
        """(row, col, height, width), to unpack or to store as a JSON list."""
        return iter((self.row, self.col, self.height, self.width))

    @property
    def row_stop(self) -> int:
        return self.row + self.height

    @property
    def col_stop(self) -> int:
        return self.col + self.width

    @property
    def is_empty(self) -> bool:
        return self.height <= 0 or self.width <= 0

    def grown(self, margin_px: int) -> Window:
        """This window with `margin_px` more pixels on every side."""
        return Window(
            self.row - margin_px,
            self.col - margin_px,
            self.height + 2 * margin_px,
            self.width + 2 * margin_px,
        )

    def slices(self, origin: Window) -> tuple[slice, slice]:
        """(rows, cols) of this window in an array that holds `origin` from its (0, 0)."""
        row, col = self.row - origin.row, self.col - origin.col
        return slice(row, row + self.height), slice(col, col + self.width)

    def block_rows(self, block_px: int) -> list[Window]:
        """Strips of `block_px` rows, top to bottom, the last one cut short."""
        return [
            Window(row, self.col, min(block_px, self.row_stop - row), self.width)
            for row in range(self.row, self.row_stop, block_px)
        ]

    def blocks(self, block_px: int) -> list[Window]:
        """Squares of `block_px`, row by row, cut short at the right and bottom edges."""
        return [
            Window(strip.row, col, strip.height, min(block_px, self.col_stop - col))
            for strip in self.block_rows(block_px)
            for col in range(self.col, self.col_stop, block_px)
        ]

    def to_rasterio(self, origin: Window | None = None) -> rasterio.windows.Window:
        """rasterio's window of this one in a raster whose (0, 0) is `origin`'s top left
        (None: the grid's)."""
        row0, col0 = (0, 0) if origin is None else (origin.row, origin.col)
        return rasterio.windows.Window(self.col - col0, self.row - row0, self.width, self.height)
