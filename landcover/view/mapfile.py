"""A land-cover map as the viewer opens it: the raster to read (a COG, or the VRT mosaic of a
tiled product), its grid, its class table and the images it was predicted from.

`landcover predict` writes the class table (`LANDCOVER_CLASS_MAP`) and the paths of the images
it read (`LANDCOVER_SOURCES`) into the map's tags. A tiled product is a directory holding
`mosaic.vrt`; a VRT carries no tags of its own, so they come from its tiles.

A map's tags are data from whoever made the file: the recorded images are used only when they
are local files that name no other file (never a URL, a GDAL virtual path or connection
string, nor a VRT or JSON that could point to one), so opening a received map fetches nothing.
Likewise a tiled product's mosaic is opened only when it reads nothing but the tiles beside it.
A mosaic whose tiles are missing (deleted, or listed by the product's collection but not by its
mosaic) is opened without them, and says which ones are missing.
"""

from __future__ import annotations

import json
import logging
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rasterio
from affine import Affine
from rasterio.crs import CRS

from landcover.errors import ViewError, reason
from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_SOURCES
from tiling.runtime.urls import is_local, local_path
from tiling.sources.classes import DEFAULT_CLASS_MAP, ClassMap, get_class_map
from tiling.sources.grid import north_up_bounds

__all__ = [
    "MapFile",
    "local_image",
    "local_map",
    "open_map",
    "product_mosaic",
    "recorded_sources",
    "wrong_bands",
]

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
    # The tiles of a mosaic that are missing: in the VRT but not on disk, or in the product's
    # collection but not in the VRT. Areas and pictures leave them out.
    missing: tuple[str, ...] = ()
    # The VRT without its missing tiles (XML, GDAL opens it as it is), read in place of `path`.
    vrt_xml: str | None = None

    @property
    def readable(self) -> str:
        """What to open to read the map's pixels: `path`, or the VRT without its missing
        tiles."""
        return self.vrt_xml if self.vrt_xml is not None else self.path

    @property
    def name(self) -> str:
        """A short label: the file name, or the directory name of a tiled product."""
        return Path(self.given.rstrip("/")).name or self.given

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(left, bottom, right, top) in `crs`."""
        return north_up_bounds(self.transform, self.width, self.height)


def wrong_bands(ds: rasterio.DatasetReader) -> str | None:
    """Why the open raster `ds` is not a land-cover map's bands (one band of uint8 class
    codes), as the middle of an error line; None when it is."""
    if ds.count == 1 and ds.dtypes[0] == "uint8":
        return None
    return f"expected a 1-band uint8 land-cover map (found {ds.count} band(s) of {ds.dtypes[0]})"


def open_map(given: str) -> MapFile:
    """The map at `given`: a GeoTIFF/COG, a VRT, or a directory holding `mosaic.vrt`.

    Refuses (`ViewError`, one line with the fix) a missing path, a directory without a
    mosaic, a raster that is not one band of uint8, one without a CRS, or a rotated one. A map
    without a class table is shown with the default table (as `evaluate` scores it).
    """
    path = _raster_path(given)
    try:
        with rasterio.open(path) as ds:
            wrong = wrong_bands(ds)
            if wrong is not None:
                raise ViewError(f"{given}: {wrong}; pass the output of `landcover predict`")
            if ds.crs is None:
                raise ViewError(
                    f"{given}: the map has no CRS; pass the output of `landcover predict`"
                )
            t = ds.transform
            if t.b != 0 or t.d != 0 or t.a <= 0 or t.e >= 0:
                raise ViewError(f"{given}: only north-up maps can be shown; warp it north-up")
            tags = _tags(ds)
            members = tuple(ds.files[1:]) if _is_vrt(ds) else (path,)
            absent = tuple(m for m in members if is_local(m) and not os.path.exists(m))
            unlisted = _unlisted_tiles(path, members) if _is_vrt(ds) else ()
            if absent or unlisted:
                names = [Path(m).name for m in (*absent, *unlisted)]
                logger.warning(
                    "%s: %d tile(s) of the product are missing (%s); areas and pictures leave "
                    "them out: predict the product again to restore them",
                    given,
                    len(names),
                    _some(names),
                )
            return MapFile(
                given=given,
                path=path,
                crs=ds.crs,
                transform=t,
                width=int(ds.width),
                height=int(ds.height),
                class_map=_class_map(given, tags),
                sources=recorded_sources(ds),
                parts=tuple(m for m in members if m not in absent),
                missing=(*absent, *unlisted),
                vrt_xml=_without(path, absent) if absent else None,
            )
    except rasterio.errors.RasterioIOError as exc:
        raise ViewError(f"{given}: cannot open the map ({reason(exc)})") from None


def recorded_sources(ds: Any) -> tuple[str, ...]:
    """The images an open map (`rasterio` dataset) was predicted from, from its
    `LANDCOVER_SOURCES` tag, or for a VRT from the tags of its tiles; () when none is
    recorded."""
    found = _sources_of(ds.tags())
    if not found and _is_vrt(ds):
        union: dict[str, None] = {}
        for tile in ds.files[1:]:
            if is_local(tile) and not os.path.exists(tile):
                continue  # said once, as a missing tile
            try:
                with rasterio.open(tile) as part:
                    union.update(dict.fromkeys(_sources_of(part.tags())))
            except rasterio.errors.RasterioIOError:
                logger.warning("cannot open the tile %s of %s", tile, ds.name)
        found = tuple(union)
    refused = [p for p in found if not local_image(p) and not _absent_local(p)]
    if refused:
        logger.warning(
            "%s: the map records %d image(s) that are not local image files (%s); they are "
            "not read (a map's tags never make this command fetch anything): pass --imagery "
            "to show them",
            ds.name,
            len(refused),
            _some(refused),
        )
    return tuple(p for p in found if p not in refused)


def local_image(path: str) -> bool:
    """Whether `path`, as recorded in a map's tags, may be opened: a local file that is not a
    URL, a GDAL virtual path (/vsicurl/...) or connection string (WMS:...), nor a text file
    (VRT, XML or JSON) that could name other files to read."""
    file = _plain_local(path)
    if file is None or not os.path.isfile(file):
        return False
    try:
        with open(file, "rb") as head:
            start = head.read(256).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return False
    return not start.startswith((b"<", b"{", b"["))


def local_map(path: str) -> bool:
    """Whether `path`, as named by a file (a change record's maps), may be opened as a map: an
    existing local file or directory, not a URL, GDAL virtual path or connection string."""
    file = _plain_local(path)
    return file is not None and os.path.exists(file)


def _plain_local(path: str) -> str | None:
    """The file system path of a local path or file:// URL; None for anything GDAL would
    read otherwise (a URL, /vsi..., an inline VRT)."""
    if not is_local(path):
        return None
    text = str(local_path(path))
    if "://" in text or text.startswith("/vsi") or "<" in text:
        return None
    return text


def _absent_local(path: str) -> bool:
    """A plain local path with no file: kept, for the pictures to name as unreadable."""
    file = _plain_local(path)
    return file is not None and not os.path.exists(file)


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _unlisted_tiles(vrt: str, members: tuple[str, ...]) -> tuple[str, ...]:
    """The tiles that the product's collection.json (beside the VRT) lists as items and the
    VRT does not name, as paths beside the VRT; () without a readable collection."""
    from landcover.prediction.tilecatalog import COLLECTION

    folder = Path(vrt).parent
    try:
        collection = json.loads((folder / COLLECTION).read_text(encoding="utf-8"))
        links = collection.get("links", [])
        items = [
            Path(str(link["href"])).stem
            for link in links
            if isinstance(link, dict) and link.get("rel") == "item" and "href" in link
        ]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return ()
    named = {Path(m).name for m in members}
    return tuple(str(folder / f"{item}.tif") for item in items if f"{item}.tif" not in named)


def _without(vrt: str, absent: tuple[str, ...]) -> str | None:
    """The XML of the VRT at `vrt` without the sources that read the files `absent`, every
    other source by its absolute path; None when the VRT cannot be read."""
    folder = Path(vrt).parent
    gone = {os.path.normpath(p) for p in absent}
    try:
        root = ET.parse(vrt).getroot()
    except (OSError, ET.ParseError):
        return None
    for band in root.iter("VRTRasterBand"):
        for source in list(band):
            name = source.find("SourceFilename")
            if name is None or not name.text:
                continue
            target = name.text
            if name.get("relativeToVRT") == "1":
                target = str(folder / target)
            if os.path.normpath(target) in gone:
                band.remove(source)
            elif name.get("relativeToVRT") == "1":
                name.set("relativeToVRT", "0")
                name.text = os.path.abspath(target)
    return ET.tostring(root, encoding="unicode")


def _raster_path(given: str) -> str:
    """The raster to open for `given`: a local path (a file:// URL is one), a tiled product's
    mosaic, or a URL as it is."""
    if not is_local(given):
        return given
    target = local_path(given)
    if target.is_dir():
        # The product's own name for it; its module imports torch, paid only here.
        from landcover.prediction.tilecatalog import MOSAIC

        mosaic = target / MOSAIC
        if not mosaic.is_file():
            raise ViewError(
                f"{given}: a directory without {MOSAIC}; give a map file or the "
                "directory of a tiled product (`landcover predict --out DIR/`)"
            )
        return product_mosaic(given, mosaic)
    if not target.exists():
        raise ViewError(f"{given}: no such map; give the path of a land-cover COG or VRT")
    return str(target)


def product_mosaic(given: str, mosaic: str | os.PathLike[str]) -> str:
    """The mosaic `mosaic` of the tiled product `given` (a directory), once its XML is seen
    to read only tiles of that directory: each source a file name relative to the VRT, in the
    directory itself, not a link out of it. A received product's mosaic may name any file or
    URL, which GDAL would read (or fetch) while opening or drawing it; one that does is
    refused (`ViewError`, one line) before GDAL opens it."""
    folder = Path(mosaic).parent
    try:
        root = ET.parse(mosaic).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ViewError(
            f"{given}: cannot read its {Path(mosaic).name} ({exc}); predict the product again"
        ) from None
    outside = [
        element.text or ""
        for element in root.iter()
        if element.tag in _VRT_FILE_ELEMENTS
        and not _own_tile(folder, element.text or "", element.get("relativeToVRT") == "1")
    ]
    if root.get("subClass") or any(e.tag in _VRT_CODE_ELEMENTS for e in root.iter()):
        outside.append(root.get("subClass") or "a pixel function")
    if outside:
        raise ViewError(
            f"{given}: its {Path(mosaic).name} reads {len(outside)} file(s) that are not tiles "
            f"of the product ({_some([repr(o) for o in outside], 3)}); a product's mosaic "
            "reads only the tiles beside it: predict the product again, or give the VRT "
            "file itself if you trust what it names"
        )
    return str(mosaic)


# Elements of a VRT that name a file (or URL, or connection string) for GDAL to open, and
# those that carry code or another kind of dataset.
_VRT_FILE_ELEMENTS = frozenset({"SourceFilename", "SourceDataset", "SrcDataset"})
_VRT_CODE_ELEMENTS = frozenset({"PixelFunctionCode", "PixelFunctionLanguage"})


def _own_tile(folder: Path, name: str, relative: bool) -> bool:
    """Whether a VRT source `name` is a file of `folder` itself: a plain name relative to the
    VRT, whose file (if any) does not lead out of the folder through a link."""
    plain = (
        relative
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\:")
        and not name.startswith("<")
    )
    if not plain:
        return False
    file = folder / name
    return not file.is_symlink() or file.resolve().parent == folder.resolve()


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
