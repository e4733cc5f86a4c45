"""Two synthetic "years" of one land-cover map whose true change is known: year one is a
synthetic scene's labels remapped to the 5-class table; year two is year one with the tree
canopy of one block turned impervious (the classic loss). The notebook
notebooks/05_area_and_change.ipynb makes its years the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio

from tests.landcover.view.maps import FIVE, write_map
from tiling.sources.classes import ClassMap

TREE, IMPERVIOUS = 2, 4  # codes of the 5-class table (chesapeake7to5)


def map_from_labels(labels: Path, out: Path) -> tuple[Path, npt.NDArray[np.uint8]]:
    """The Chesapeake labels at `labels` as a tagged 5-class map COG at `out`."""
    with rasterio.open(labels) as ds:
        raw = ds.read(1)
        codes = FIVE.apply(raw, nodata=None if ds.nodata is None else int(ds.nodata))
        t, crs = ds.transform, ds.crs.to_string()
    return write_map(out, codes, x0=t.c, y0=t.f, res=t.a, crs=crs), codes


def second_year(
    codes: npt.NDArray[np.uint8], out: Path, like: Path, rows: slice, cols: slice
) -> tuple[Path, npt.NDArray[np.uint8]]:
    """`codes` with the tree canopy in the block (`rows`, `cols`) made impervious, as a map
    COG on the grid of the map `like`."""
    changed = codes.copy()
    block = changed[rows, cols]
    block[block == TREE] = IMPERVIOUS
    with rasterio.open(like) as ds:
        t, crs = ds.transform, ds.crs.to_string()
    return write_map(out, changed, x0=t.c, y0=t.f, res=t.a, crs=crs), changed


def true_transitions(
    before: npt.NDArray[np.uint8], after: npt.NDArray[np.uint8]
) -> npt.NDArray[np.int64]:
    """The from-to pixel counts over classes 1..4 (pixels that are nodata in either map
    left out), counted directly from the two arrays."""
    both = (before > 0) & (after > 0)
    flat = (before[both].astype(np.int64) - 1) * 4 + (after[both].astype(np.int64) - 1)
    return np.bincount(flat, minlength=16).reshape(4, 4)


def retag(path: Path, class_map: ClassMap) -> Path:
    """Give the map at `path` the class table `class_map` (its tag rewritten in place)."""
    with rasterio.open(path, "r+", IGNORE_COG_LAYOUT_BREAK="YES") as ds:
        ds.update_tags(LANDCOVER_CLASS_MAP=json.dumps(class_map.to_json()))
    return path
