"""Prediction regions: a polygon in some CRS, parsed once from GeoJSON, a bbox or WKT.

A `Region` is a value: a shapely geometry (polygonal, valid, non-empty) and the CRS its
coordinates are in. Reprojection densifies the edges first, so a bbox given in degrees stays
close to its true curved outline once it is in UTM metres.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyproj
import rasterio
import shapely
from pyproj.exceptions import CRSError as ProjCRSError
from rasterio.crs import CRS
from rasterio.errors import CRSError
from shapely.errors import GEOSException
from shapely.geometry import box, shape
from shapely.geometry.base import BaseGeometry

from landcover.errors import RegionError, reason
from tiling.runtime.jsontext import parse_json
from tiling.sources.crs import transformer

DEFAULT_REGION_CRS = "EPSG:4326"
# Edge segments per side when reprojecting: enough that a 1-degree box in UTM is within
# centimetres of the exact outline, cheap for any region a user types.
_DENSIFY_SEGMENTS = 64


@dataclass(frozen=True, slots=True)
class Region:
    """A polygonal area of interest in `crs` (a valid, non-empty Polygon or MultiPolygon)."""

    geometry: BaseGeometry
    crs: CRS

    def to_crs(self, crs: CRS) -> Region:
        """The same area in another CRS (edges densified before the transform)."""
        if crs == self.crs:
            return self
        return Region(reproject_geometry(self.geometry, self.crs, crs), crs)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        minx, miny, maxx, maxy = self.geometry.bounds
        return (float(minx), float(miny), float(maxx), float(maxy))


def parse_crs(text: str | CRS, *, what: str = "--region-crs") -> CRS:
    """A CRS from `EPSG:4326`, a WKT or PROJ string; RegionError naming `what` otherwise."""
    if isinstance(text, CRS):
        return text
    try:
        with _gdal_quiet():
            return CRS.from_user_input(text)
    except (CRSError, ProjCRSError, ValueError):
        raise RegionError(
            f"{what} {text!r} is not a CRS; use e.g. EPSG:4326 or EPSG:26916"
        ) from None


@contextlib.contextmanager
def _gdal_quiet() -> Iterator[None]:
    """Keep GDAL's and PROJ's own report of a failure ("ERROR 1: PROJ: crs not found") off
    stderr and out of the log within the block: the RegionError that follows says it in one
    line. Inside rasterio.Env, GDAL reports to the `rasterio._env` logger instead of
    printing; a filter drops those records there until the block ends."""
    gdal_logger = logging.getLogger("rasterio._env")

    def drop(record: logging.LogRecord) -> bool:
        return False

    gdal_logger.addFilter(drop)
    try:
        with rasterio.Env():
            yield
    finally:
        gdal_logger.removeFilter(drop)


def parse_bbox(text: str, *, crs: str | CRS = DEFAULT_REGION_CRS) -> Region:
    """`W,S,E,N` (in `crs`) as a rectangular region."""
    parts = [p.strip() for p in text.split(",")]
    try:
        west, south, east, north = (float(p) for p in parts)
    except ValueError:
        raise RegionError(
            f"--bbox {text!r} must be four numbers W,S,E,N, e.g. -76.6,38.9,-76.5,39.0"
        ) from None
    if not all(math.isfinite(v) for v in (west, south, east, north)):
        raise RegionError(f"--bbox {text!r} holds a value that is not a finite number")
    if not (west < east and south < north):
        raise RegionError(f"--bbox {text!r} must have W < E and S < N (order is W,S,E,N)")
    return Region(box(west, south, east, north), parse_crs(crs))


def parse_region(text: str | os.PathLike[str], *, crs: str | CRS | None = None) -> Region:
    """A region from a GeoJSON file, a WKT string, or a file holding WKT.

    GeoJSON may be a Feature, a FeatureCollection (the union of its features) or a bare
    geometry. Coordinates are in `crs` (default EPSG:4326, the GeoJSON standard); a legacy
    GeoJSON `crs` member is honoured when `crs` is not given.
    """
    source = os.fspath(text)
    stripped = source.strip()
    if _looks_like_wkt(stripped):
        return _region_from_wkt(stripped, crs, where="--region")
    path = Path(source)
    if not path.is_file():
        raise RegionError(
            f"--region {source!r}: no such file and not WKT; give a GeoJSON file, a WKT "
            "string like 'POLYGON ((...))', or use --bbox W,S,E,N"
        )
    try:
        body = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RegionError(f"{source}: cannot read region file ({exc.__class__.__name__})") from None
    if _looks_like_wkt(body.strip()):
        return _region_from_wkt(body.strip(), crs, where=source)
    obj = parse_json(
        body,
        where=source,
        problem="invalid GeoJSON",
        fix="give a Feature, FeatureCollection or geometry",
        error=RegionError,
    )
    return region_from_geojson(obj, crs=crs, where=source)


def region_from_geojson(obj: Any, *, crs: str | CRS | None = None, where: str = "region") -> Region:
    """A region from a parsed GeoJSON object (Feature, FeatureCollection or geometry)."""
    if not isinstance(obj, Mapping):
        raise RegionError(f"{where}: invalid GeoJSON: expected an object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind == "FeatureCollection":
        features = obj.get("features")
        if not isinstance(features, list) or not features:
            raise RegionError(f"{where}: invalid GeoJSON: FeatureCollection has no features")
        geoms = [_geometry_of_feature(f, where) for f in features]
    elif kind == "Feature":
        geoms = [_geometry_of_feature(obj, where)]
    elif kind in _GEOMETRY_TYPES:
        geoms = [_geometry_from_mapping(obj, where)]
    else:
        raise RegionError(
            f"{where}: invalid GeoJSON: type {kind!r}; expected Feature, FeatureCollection "
            "or a Polygon/MultiPolygon geometry"
        )
    geometry = shapely.union_all(geoms) if len(geoms) > 1 else geoms[0]
    region_crs = crs if crs is not None else _legacy_geojson_crs(obj, where)
    return _checked(geometry, parse_crs(region_crs or DEFAULT_REGION_CRS), where)


def reproject_geometry(geometry: BaseGeometry, src_crs: CRS, dst_crs: CRS) -> BaseGeometry:
    """`geometry` from `src_crs` to `dst_crs`, edges densified so curvature is kept."""
    minx, miny, maxx, maxy = geometry.bounds
    span = max(maxx - minx, maxy - miny)
    dense = shapely.segmentize(geometry, span / _DENSIFY_SEGMENTS) if span > 0 else geometry
    to_dst = transformer(src_crs, dst_crs)  # built once per CRS pair: one per source is costly
    moved = shapely.transform(dense, lambda xy: _transform_xy(to_dst, xy))
    if not moved.is_valid:
        moved = shapely.make_valid(moved)
    return moved


def _transform_xy(transformer: pyproj.Transformer, xy: Any) -> Any:
    import numpy as np

    x, y = transformer.transform(xy[:, 0], xy[:, 1])
    out = np.column_stack([x, y])
    if not np.isfinite(out).all():
        raise RegionError(
            "region cannot be reprojected onto the images' CRS (it reaches outside the "
            "CRS's valid area); check --region-crs"
        )
    return out


_GEOMETRY_TYPES = {
    "Point",
    "MultiPoint",
    "LineString",
    "MultiLineString",
    "Polygon",
    "MultiPolygon",
    "GeometryCollection",
}


def _geometry_of_feature(feature: Any, where: str) -> BaseGeometry:
    if not isinstance(feature, Mapping) or feature.get("type") != "Feature":
        raise RegionError(f"{where}: invalid GeoJSON: a feature is not a Feature object")
    geometry = feature.get("geometry")
    if geometry is None:
        raise RegionError(f"{where}: invalid GeoJSON: a feature has no geometry")
    return _geometry_from_mapping(geometry, where)


def _geometry_from_mapping(obj: Any, where: str) -> BaseGeometry:
    try:
        return shape(obj)
    except (GEOSException, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise RegionError(f"{where}: invalid GeoJSON geometry ({reason(exc)})") from None


def _legacy_geojson_crs(obj: Mapping[str, Any], where: str) -> str | None:
    # GeoJSON 2008 allowed {"crs": {"type": "name", "properties": {"name": "EPSG:26916"}}};
    # QGIS and ogr2ogr still write it for projected data.
    member = obj.get("crs")
    if not isinstance(member, Mapping):
        return None
    props = member.get("properties")
    name = props.get("name") if isinstance(props, Mapping) else None
    if not isinstance(name, str):
        raise RegionError(f"{where}: GeoJSON 'crs' member has no name; pass --region-crs")
    return name


def _looks_like_wkt(text: str) -> bool:
    head = text[:20].upper().lstrip()
    return head.startswith(("POLYGON", "MULTIPOLYGON", "GEOMETRYCOLLECTION"))


def _region_from_wkt(text: str, crs: str | CRS | None, *, where: str) -> Region:
    try:
        geometry = shapely.from_wkt(text)
    except (GEOSException, ValueError) as exc:
        raise RegionError(f"{where}: invalid WKT ({reason(exc)})") from None
    return _checked(geometry, parse_crs(crs or DEFAULT_REGION_CRS), where)


def _checked(geometry: BaseGeometry, crs: CRS, where: str) -> Region:
    if geometry.is_empty:
        raise RegionError(f"{where}: region geometry is empty")
    if not geometry.is_valid:
        geometry = shapely.make_valid(geometry)
    # Keep only the areal parts: points and lines cover no pixels.
    polygonal = shapely.union_all(
        [g for g in shapely.get_parts(geometry) if g.geom_type in ("Polygon", "MultiPolygon")]
    )
    if polygonal.is_empty or polygonal.area <= 0:
        raise RegionError(
            f"{where}: region has no area ({geometry.geom_type}); give a Polygon or MultiPolygon"
        )
    return Region(polygonal, crs)
