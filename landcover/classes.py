"""Class tables for models and maps.

The tables and remaps themselves live in `tiling.classes` (the tile command applies them);
this module adds what only the model side needs: colormaps for rasters and plots.
"""

from __future__ import annotations

from tiling.classes import (
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
]


def colormap(class_map: ClassMap) -> dict[int, tuple[int, int, int, int]]:
    """GDAL colormap (code → RGBA) for a uint8 class raster; nodata is transparent."""
    cmap = {c.code: (*c.color, 255) for c in class_map.classes}
    cmap[NODATA_CODE] = (0, 0, 0, 0)
    return cmap


def matplotlib_colors(class_map: ClassMap) -> list[tuple[float, float, float]]:
    """Colours as 0..1 floats in code order, for `ListedColormap`."""
    return [tuple(v / 255 for v in c.color) for c in class_map.classes]  # type: ignore[misc]
