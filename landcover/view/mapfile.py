"""A land-cover map as the viewer opens it: the raster to read (a COG, or the VRT mosaic of a
tiled product), its grid, its class table and the images it was predicted from.

`landcover predict` writes the class table (`LANDCOVER_CLASS_MAP`) and the paths of the images
it read (`LANDCOVER_SOURCES`) into the map's tags. A tiled product is a directory holding
`mosaic.vrt`; a VRT carries no tags of its own, so they come from its tiles.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rasterio
from affine import Affine
from rasterio.crs import CRS

from landcover.errors import ViewError
from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_SOURCES
from tiling.classes import DEFAULT_CLASS_MAP, ClassMap, get_class_map
from tiling.shared.urls import is_local

__all__ = ["MapFile", "open_map", "recorded_sources"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MapFile:
    """A land-cover map: `path` is the raster read (a COG or a VRT), `given` what the user
    named (a file or a tiled product's directory)."""

    given: str
    path: str
    crs: CRS
    transform: Affine
    width: int
    height: int
    class_map: ClassMap
    sources: tuple[str, ...]  # the images it was predicted from, as recorded
    # The files holding its pixels: the map itself, or a VRT's tiles (GDAL exposes no
    # overviews for a VRT of several files: pictures read each tile's own).
    parts: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """A short label: the file name, or the directory name of a tiled product."""
        return Path(self.given.rstrip("/")).name or self.given

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) in `crs`."""
        left, top = self.transform.c, self.transform.f
        right = left + self.width * self.transform.a
        bottom = top + self.height * self.transform.e
        return (left, bottom, right, top)


def open_map(given: str) -> MapFile:
    """The map at `given`: a GeoTIFF/COG, a VRT, or a directory holding `mosaic.vrt`.

    Refuses (`ViewError`, one line with the fix) a missing path, a directory without a
    mosaic, a raster that is not one band of uint8, one without a CRS, or a rotated one. A map
    without a class table is shown with the default table (as `evaluate` scores it).
    """
    path = _raster_path(given)
    try:
        with rasterio.open(path) as ds:
            if ds.count != 1 or ds.dtypes[0] != "uint8":
                raise ViewError(
                    f"{given}: expected a 1-band uint8 land-cover map (found {ds.count} band(s) "
                    f"of {ds.dtypes[0]}); pass the output of `landcover predict`"
                )
            if ds.crs is None:
                raise ViewError(
                    f"{given}: the map has no CRS; pass the output of `landcover predict`"
                )
            t = ds.transform
            if t.b != 0 or t.d != 0 or t.a <= 0 or t.e >= 0:
                raise ViewError(f"{given}: only north-up maps can be shown; warp it north-up")
            tags = _tags(ds)
            return MapFile(
                given=given,
                path=path,
                crs=ds.crs,
                transform=t,
                width=int(ds.width),
                height=int(ds.height),
                class_map=_class_map(given, tags),
                sources=recorded_sources(ds),
                parts=tuple(ds.files[1:]) if _is_vrt(ds) else (path,),
            )
    except rasterio.errors.RasterioIOError as exc:
        raise ViewError(f"{given}: cannot open the map ({exc})".splitlines()[0]) from None


def recorded_sources(ds: Any) -> tuple[str, ...]:
    """The images an open map (`rasterio` dataset) was predicted from, from its
    `LANDCOVER_SOURCES` tag, or for a VRT from the tags of its tiles; () when none is
    recorded."""
    found = _sources_of(ds.tags())
    if found or not _is_vrt(ds):
        return found
    union: dict[str, None] = {}
    for tile in ds.files[1:]:
        try:
            with rasterio.open(tile) as part:
                union.update(dict.fromkeys(_sources_of(part.tags())))
        except rasterio.errors.RasterioIOError:
            logger.warning("cannot open the tile %s of %s", tile, ds.name)
    return tuple(union)


def _raster_path(given: str) -> str:
    target = Path(given)
    if is_local(given) and target.is_dir():
        # The product's own name for it; its module imports torch, paid only here.
        from landcover.prediction.tilecatalog import MOSAIC

        mosaic = target / MOSAIC
        if not mosaic.is_file():
            raise ViewError(
                f"{given}: a directory without {MOSAIC}; give a map file or the "
                "directory of a tiled product (`landcover predict --out DIR/`)"
            )
        return str(mosaic)
    if is_local(given) and not target.exists():
        raise ViewError(f"{given}: no such map; give the path of a land-cover COG or VRT")
    return given


def _is_vrt(ds: Any) -> bool:
    return str(ds.driver).upper() == "VRT"


def _tags(ds: Any) -> dict[str, str]:
    """The dataset's tags, or for a VRT without a class table those of its first tile."""
    tags: dict[str, str] = dict(ds.tags())
    if TAG_CLASS_MAP in tags or not _is_vrt(ds) or len(ds.files) < 2:
        return tags
    try:
        with rasterio.open(ds.files[1]) as tile:
            return {**dict(tile.tags()), **tags}
    except rasterio.errors.RasterioIOError:
        return tags


def _class_map(given: str, tags: dict[str, str]) -> ClassMap:
    text = tags.get(TAG_CLASS_MAP)
    if text is None:
        logger.info("%s has no class table; showing it with %s", given, DEFAULT_CLASS_MAP)
        return get_class_map(DEFAULT_CLASS_MAP)
    try:
        return ClassMap.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError):
        raise ViewError(
            f"{given}: damaged {TAG_CLASS_MAP} metadata; predict the map again"
        ) from None


def _sources_of(tags: dict[str, str]) -> tuple[str, ...]:
    text = tags.get(TAG_SOURCES)
    if not text:
        return ()
    try:
        paths = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(paths, list):
        return ()
    return tuple(str(p) for p in paths if isinstance(p, str))
