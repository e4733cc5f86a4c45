"""Grid arithmetic: where chips sit in an image and how they group into reads, and when two
pixel grids are the same grid (`GRID_TOLERANCE_PX`, `aligned_offset`).

Pure functions and value objects, no I/O.

Edge rule: chips start at 0, stride, 2·stride, ... while they fit. When the image is not a
multiple of the stride and pixels would be left over at the right or bottom edge, one more
chip is placed flush with that edge (overlapping its neighbour), so every pixel lies in at
least one chip and no chip is padded. With a stride larger than the chip size the grid is a
sparse sample and no edge chip is added.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from affine import Affine

from tiling.errors import TilingError

if TYPE_CHECKING:
    from rasterio.windows import Window

GRID_TOLERANCE_PX = 1e-3
"""Two pixel grids are one grid when, over the raster, no pixel edge of one lies further than
this fraction of a pixel from the other's. Then pixels are read by window instead of warped.
Why 1e-3: labels are warped with nearest neighbour, which samples pixel centres, half a pixel
from any edge, so any shift below 0.5 px picks the same label; imagery is warped bilinearly,
and a 1e-3 px shift moves a uint8 value by at most 0.255 (< half a step). Reading is exact
and much cheaper than GDAL's warper, and transforms that went through a CRS round trip or a
decimal print (errors of 1e-9..1e-6 px) must not be warped for float noise."""


def chip_offsets(length_px: int, chip_size: int, stride: int) -> tuple[int, ...]:
    """Start offsets (pixels) of the chips along one axis of `length_px` pixels. The chip size
    and stride are positive: `tiling.tiler.config.TileConfig` checks them at the boundary."""
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
    """The grid of an image, or a one-line `TilingError` naming the image and the fix (the
    chip size and stride themselves are checked once, by `tiling.tiler.config.TileConfig`)."""
    if chip_size > height or chip_size > width:
        raise TilingError(
            f"{where}: chip size {chip_size} is larger than the image ({height} x {width} px); "
            f"pass --chip-size {min(height, width)} or smaller"
        )
    return ChipGrid(height, width, chip_size, stride)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def same_pixel_size(a: Affine, b: Affine, *, span_px: int) -> bool:
    """Both north-up (no rotation) with pixel sizes that drift apart by at most
    `GRID_TOLERANCE_PX` over `span_px` pixels."""
    if a.b or a.d or b.b or b.d:
        return False
    return abs(a.a - b.a) * span_px <= GRID_TOLERANCE_PX * abs(b.a) and abs(
        a.e - b.e
    ) * span_px <= GRID_TOLERANCE_PX * abs(b.e)


def aligned_offset(a: Affine, b: Affine, *, span_px: int) -> tuple[int, int] | None:
    """(rows, cols) from a pixel of grid `a` to the same pixel of grid `b` when they are one
    grid over `span_px` pixels (same pixel size, origins a whole number of pixels apart, both
    within `GRID_TOLERANCE_PX`), else None. The grids' CRSs are the caller's to compare."""
    if not same_pixel_size(a, b, span_px=span_px):
        return None
    cols = (a.c - b.c) / b.a
    rows = (a.f - b.f) / b.e
    if max(abs(cols - round(cols)), abs(rows - round(rows))) > GRID_TOLERANCE_PX:
        return None
    return round(rows), round(cols)


def snap_px(rounding: Callable[[float], int], value_px: float) -> int:
    """`rounding(value_px)`, except that a value within `GRID_TOLERANCE_PX` of an integer is
    that integer: bounds that came through a CRS round trip must not grow a grid by a pixel."""
    nearest = round(value_px)
    if abs(value_px - nearest) < GRID_TOLERANCE_PX:
        return int(nearest)
    return int(rounding(value_px))


def north_up_bounds(
    transform: Affine, width: int, height: int
) -> tuple[float, float, float, float]:
    """(left, bottom, right, top) of the north-up grid of `width` x `height` pixels whose
    `transform` maps (col, row) to coordinates."""
    left, top = transform.c, transform.f
    return (left, top + height * transform.e, left + width * transform.a, top)


def covering_window(
    bounds: tuple[float, float, float, float], transform: Affine, height: int, width: int
) -> Window | None:
    """The pixels of the `height` x `width` raster under `transform` that cover `bounds`
    (left, bottom, right, top), plus a pixel of margin on each side for resampling, clipped
    to the raster; None when the raster does not reach `bounds`."""
    from rasterio.windows import Window, from_bounds  # rasterio: only when a raster is read

    window = from_bounds(*bounds, transform=transform)
    row0 = max(0, math.floor(window.row_off) - 1)
    col0 = max(0, math.floor(window.col_off) - 1)
    row1 = min(height, math.ceil(window.row_off + window.height) + 1)
    col1 = min(width, math.ceil(window.col_off + window.width) + 1)
    if row1 <= row0 or col1 <= col0:
        return None
    return Window(col0, row0, col1 - col0, row1 - row0)
