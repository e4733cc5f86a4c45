"""Chip-grid arithmetic: where chips sit in an image and how they group into reads.

Pure functions and value objects, no I/O.

Edge rule: chips start at 0, stride, 2·stride, ... while they fit. When the image is not a
multiple of the stride and pixels would be left over at the right or bottom edge, one more
chip is placed flush with that edge (overlapping its neighbour), so every pixel lies in at
least one chip and no chip is padded. With a stride larger than the chip size the grid is a
sparse sample and no edge chip is added.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiling.errors import TilingError


def chip_offsets(length_px: int, chip_size: int, stride: int) -> tuple[int, ...]:
    """Start offsets (pixels) of the chips along one axis of `length_px` pixels."""
    if chip_size < 1 or stride < 1:
        raise ValueError(f"chip size and stride must be positive, got {chip_size}, {stride}")
    if chip_size > length_px:
        raise ValueError(f"chip size {chip_size} exceeds length {length_px}")
    offsets = list(range(0, length_px - chip_size + 1, stride))
    if stride <= chip_size and offsets[-1] + chip_size < length_px:
        offsets.append(length_px - chip_size)
    return tuple(offsets)


@dataclass(frozen=True, slots=True)
class ReadWindow:
    """One read: a pixel window of the image and the chips (grid row, grid col) inside it."""

    row_px: int
    col_px: int
    height: int
    width: int
    chips: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class ChipGrid:
    """The chips of one image: offsets along each axis, chip size and stride in pixels."""

    height: int
    width: int
    chip_size: int
    stride: int
    row_offsets: tuple[int, ...] = field(init=False)
    col_offsets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "row_offsets", chip_offsets(self.height, self.chip_size, self.stride)
        )
        object.__setattr__(
            self, "col_offsets", chip_offsets(self.width, self.chip_size, self.stride)
        )

    @property
    def rows(self) -> int:
        return len(self.row_offsets)

    @property
    def cols(self) -> int:
        return len(self.col_offsets)

    @property
    def num_chips(self) -> int:
        return self.rows * self.cols

    def chip_origin(self, i: int, j: int) -> tuple[int, int]:
        """(row_px, col_px) of chip (i, j)."""
        return self.row_offsets[i], self.col_offsets[j]

    def read_windows(self, *, min_height_px: int, max_width_px: int) -> tuple[ReadWindow, ...]:
        """Group chips into windows to read at once, in row-major order of windows.

        A window spans whole chip rows (at least `min_height_px` tall when the grid allows,
        e.g. the file's block height, so no compressed block is decoded twice) and at most
        `max_width_px` (but at least one chip) wide, which bounds the memory of one read.
        """
        rows_per = max(1, _ceil_div(max(min_height_px - self.chip_size, 0), self.stride) + 1)
        cols_per = max(1, (max(max_width_px, self.chip_size) - self.chip_size) // self.stride + 1)
        windows = []
        for i0 in range(0, self.rows, rows_per):
            i1 = min(i0 + rows_per, self.rows)
            for j0 in range(0, self.cols, cols_per):
                j1 = min(j0 + cols_per, self.cols)
                top, left = self.row_offsets[i0], self.col_offsets[j0]
                windows.append(
                    ReadWindow(
                        row_px=top,
                        col_px=left,
                        height=self.row_offsets[i1 - 1] + self.chip_size - top,
                        width=self.col_offsets[j1 - 1] + self.chip_size - left,
                        chips=tuple((i, j) for i in range(i0, i1) for j in range(j0, j1)),
                    )
                )
        return tuple(windows)


def chip_grid(height: int, width: int, chip_size: int, stride: int, *, where: str) -> ChipGrid:
    """The grid of an image, or a one-line `TilingError` naming the image and the fix."""
    if chip_size < 1:
        raise TilingError(f"--chip-size must be positive, got {chip_size}")
    if stride < 1:
        raise TilingError(f"--stride must be positive, got {stride}")
    if chip_size > height or chip_size > width:
        raise TilingError(
            f"{where}: chip size {chip_size} is larger than the image ({height} x {width} px); "
            f"pass --chip-size {min(height, width)} or smaller"
        )
    return ChipGrid(height, width, chip_size, stride)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
