"""Class tables for models and maps.

The tables and remaps themselves live in `tiling.sources.classes` (the tile command applies them);
this module adds what only the model side needs: colormaps for rasters and plots.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tiling.sources.classes import (
    DEFAULT_CLASS_MAP,
    NODATA_CODE,
    ClassInfo,
    ClassMap,
    available_class_maps,
    get_class_map,
)

__all__ = [
    "DEFAULT_CLASS_MAP",
    "NODATA_CODE",
    "ClassInfo",
    "ClassMap",
    "available_class_maps",
    "colormap",
    "get_class_map",
    "matplotlib_colors",
    "unknown_codes",
]


def colormap(class_map: ClassMap) -> dict[int, tuple[int, int, int, int]]:
    """GDAL colormap (code → RGBA) for a uint8 class raster; nodata is transparent."""
    cmap = {c.code: (*c.color, 255) for c in class_map.classes}
    cmap[NODATA_CODE] = (0, 0, 0, 0)
    return cmap


def matplotlib_colors(class_map: ClassMap) -> list[tuple[float, float, float]]:
    """Colours as 0..1 floats in code order, for `ListedColormap`."""
    return [tuple(v / 255 for v in c.color) for c in class_map.classes]  # type: ignore[misc]


def unknown_codes(
    codes: npt.NDArray[np.uint8], class_map: ClassMap, *, table: str | None = None
) -> str | None:
    """What the map pixels `codes` hold that `class_map` has no class for, as the middle of
    an error line ("holds class codes 7, 9 outside its class table 'five' (codes 0-4)", at
    most 8 codes listed); None when every code is in the table. `table` words the table
    otherwise than "its class table '<name>'"."""
    k = class_map.num_classes
    if not codes.size or int(codes.max()) < k:
        return None
    outside = np.flatnonzero(np.bincount(codes.ravel(), minlength=256)[k:]) + k
    listed = ", ".join(str(int(c)) for c in outside[:8])
    table = table or f"its class table {class_map.name!r}"
    return f"holds class codes {listed} outside {table} (codes 0-{k - 1})"
