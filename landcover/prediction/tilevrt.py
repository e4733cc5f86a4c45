"""The VRT that shows a map made of tiles as one raster: a tiled product's `mosaic.vrt`, and
a tiled change's.

It starts from GDAL's VRT of the first tile, so that the colour table, band tags and data
type are the tiles' own, widens it to the whole grid, and gives each band one source per
tile, placed at the tile's rectangle of the grid (paths relative to the VRT).
"""

from __future__ import annotations

import copy
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import rasterio.shutil
from affine import Affine

__all__ = ["VrtTile", "write_tile_vrt"]

_SOURCE_TAGS = ("SimpleSource", "ComplexSource")


@dataclass(frozen=True, slots=True)
class VrtTile:
    """A tile file (`name`, relative to the VRT) and its rectangle of the grid in pixels."""

    name: str
    row0: int
    col0: int
    height: int
    width: int


def write_tile_vrt(
    vrt: str,
    first_tile: str,
    tiles: Sequence[VrtTile],
    *,
    transform: Affine,
    width: int,
    height: int,
    edit: Callable[[ET.Element], None] | None = None,
) -> None:
    """Write at `vrt` the VRT of the `width` x `height` grid under `transform` over `tiles`,
    made from GDAL's VRT of the local file `first_tile`; `edit(root)` changes the VRT's XML
    (its tags) before the tiles are placed."""
    template = os.path.join(os.path.dirname(vrt), ".template.vrt")
    rasterio.shutil.copy(first_tile, template, driver="VRT")
    tree = ET.parse(template)
    root = tree.getroot()
    root.set("rasterXSize", str(width))
    root.set("rasterYSize", str(height))
    geo = root.find("GeoTransform")
    if geo is not None:
        geo.text = ", ".join(repr(float(v)) for v in transform.to_gdal())
    if edit is not None:
        edit(root)
    for band in root.iter("VRTRasterBand"):
        sources = [e for e in band if e.tag in _SOURCE_TAGS]
        for source in sources:
            band.remove(source)
        for tile in tiles:
            band.append(_placed(sources[0], tile))
    tree.write(vrt, encoding="utf-8")
    os.unlink(template)


def _placed(source: ET.Element, tile: VrtTile) -> ET.Element:
    """A copy of a VRT source reading `tile` at its place in the grid."""
    placed = copy.deepcopy(source)
    name = placed.find("SourceFilename")
    if name is not None:
        name.set("relativeToVRT", "1")
        name.text = tile.name
    size = {"xSize": str(tile.width), "ySize": str(tile.height)}
    properties = placed.find("SourceProperties")
    if properties is not None:
        properties.set("RasterXSize", size["xSize"])
        properties.set("RasterYSize", size["ySize"])
    for tag, (x, y) in (("SrcRect", (0, 0)), ("DstRect", (tile.col0, tile.row0))):
        rect = placed.find(tag)
        if rect is not None:
            rect.attrib.update(xOff=str(x), yOff=str(y), **size)
    return placed
