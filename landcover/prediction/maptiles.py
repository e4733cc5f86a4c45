"""The tiles of a tiled map product: a fixed lattice over the output grid, each tile's name,
the work in it, and which rank predicts which tiles.

The lattice has square tiles of `tile_px` pixels whose edges lie on multiples of `tile_px`
pixels from the CRS's origin (0, 0), as the Chesapeake and ESA WorldCover tiles lie on round
map coordinates; tiles at the grid's edges are cut to the grid. A tile is named by the map
coordinates of the upper-left corner of its lattice cell, `E{x}_N{y}` (integers when the
corner is one, else up to six decimals with `p` for the point): the name is the same for the
same place in every run of that grid resolution and tile size, whatever the region.

Tiles are the unit of work: each rank takes whole tiles, balanced by the area of
region ∩ images in them (greedy longest-processing-time assignment: the largest tile first,
to the rank with the least work so far). A pure function of the plan, so every rank computes
the same assignment without talking to the others.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import shapely
from shapely.geometry import box

from landcover.prediction.gridwindow import Window
from landcover.prediction.outgrid import GridPlan, OutputGrid

# Coordinates of tile corners in names: rounded to this many decimals (a millionth of a unit).
NAME_DECIMALS = 6


@dataclass(frozen=True, slots=True)
class MapTile:
    """One tile: its name and its rectangle of the output grid in pixels."""

    name: str
    row0: int
    col0: int
    height: int
    width: int

    @property
    def window(self) -> Window:
        """The tile's pixels of the output grid."""
        return Window(self.row0, self.col0, self.height, self.width)

    def grid(self, grid: OutputGrid) -> OutputGrid:
        """The grid of this tile alone (the grid of its COG)."""
        return grid.sub(self.window)

    def blocks(self, block_px: int) -> list[Window]:
        """The tile's blocks, row by row, from its own top-left corner."""
        return self.window.blocks(block_px)


def map_tiles(grid: OutputGrid, tile_px: int) -> list[MapTile]:
    """Every tile of the lattice that overlaps `grid`, row by row."""
    col_phase = _lattice_phase(grid.transform.c / grid.resolution, tile_px)
    row_phase = _lattice_phase(-grid.transform.f / grid.resolution, tile_px)
    tiles = []
    for cell_row in range(-row_phase, grid.height, tile_px):
        row0, row1 = max(cell_row, 0), min(cell_row + tile_px, grid.height)
        for cell_col in range(-col_phase, grid.width, tile_px):
            col0, col1 = max(cell_col, 0), min(cell_col + tile_px, grid.width)
            left, top = grid.transform @ (cell_col, cell_row)
            name = f"E{_coordinate(left)}_N{_coordinate(top)}"
            tiles.append(MapTile(name, row0, col0, row1 - row0, col1 - col0))
    return tiles


def tile_costs(plan: GridPlan, tiles: Sequence[MapTile]) -> list[int]:
    """The work in each tile: the area of region ∩ images inside it, in whole pixels (every
    rank rounds the same float the same way).

    The area is one geometry whose vertices grow with the count of images, so it is prepared
    once (an index of its edges): a tile inside it or clear of it costs a lookup, and only the
    tiles on its boundary are clipped."""
    area = plan.area
    shapely.prepare(area)
    costs = []
    for tile in tiles:
        outline = box(*plan.grid.bounds_of(tile.window))
        if not plan.sources_touching(outline):  # the footprint index: no geometry work
            costs.append(0)
            continue
        if area.contains(outline):
            inside = outline.area
        elif area.intersects(outline):
            inside = shapely.clip_by_rect(area, *outline.bounds).area
        else:
            inside = 0.0
        costs.append(round(inside / plan.grid.resolution**2))
    return costs


def assign_tiles(costs: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of the tiles with work (cost > 0) that each of `world_size` ranks predicts:
    the largest first, each to the rank with the least work so far (the lowest rank on a
    tie); each rank's list in tile order."""
    loads = [(0, rank) for rank in range(world_size)]
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted((i for i, c in enumerate(costs) if c > 0), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(loads)
        owned[rank].append(index)
        heapq.heappush(loads, (load + costs[index], rank))
    return [sorted(indices) for indices in owned]


def _lattice_phase(position_px: float, tile_px: int) -> int:
    """How many pixels the grid's first row or column lies past its lattice cell's edge."""
    return math.floor(position_px + 1e-6) % tile_px


def _coordinate(value: float) -> str:
    rounded = round(value, NAME_DECIMALS)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.{NAME_DECIMALS}f}".rstrip("0").replace(".", "p")
