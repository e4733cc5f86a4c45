"""Coordinate transformations built once per pair of CRSs.

Building a `pyproj.Transformer` costs milliseconds (PROJ searches its database for the
operation); a plan over thousands of sources in a handful of CRSs builds each pair once.
A CRS is keyed by its WKT, and each thread gets its own transformer: PROJ contexts are
per thread.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from pyproj import Transformer
from rasterio.crs import CRS

__all__ = ["crs_key", "transformer"]


def crs_key(crs: CRS | str) -> str:
    """A hashable key equal for equal CRS definitions (the WKT; a string is taken as given)."""
    return crs if isinstance(crs, str) else crs.to_wkt()


def transformer(src: CRS | str, dst: CRS | str) -> Transformer:
    """The always-x,y transformer from `src` to `dst`, built once per pair and thread."""
    return _cached(crs_key(src), crs_key(dst), threading.get_ident())


@lru_cache(maxsize=256)
def _cached(src: str, dst: str, thread: int) -> Transformer:
    return Transformer.from_crs(src, dst, always_xy=True)
