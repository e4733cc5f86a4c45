"""`landcover change`: two maps of one region and class table on one grid become a change COG
(from-to codes, `landcover.change.transitions`) and the transition matrix, read and written
in blocks so that a state's maps stream.

The maps are COGs, VRTs or tiled products (their `mosaic.vrt`). They must share the CRS and
the pixel grid (transform and size), or the command refuses in one line; with `resample`, the
after map is warped onto the before map's grid (nearest neighbour, a class is never blended)
as it is read. The output directory receives change.tif, change.json (the `Transitions`
record), change.md and change.png, all or none.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from landcover.change.transitions import (
    CHANGE_MAP,
    CHANGE_RECORD,
    Transitions,
    change_class_map,
    change_codes,
    check_same_classes,
    transitions_png,
)
from landcover.classes import colormap
from landcover.errors import ChangeError
from landcover.evaluation.sampling import pixel_area_m2, require_whole
from landcover.outputs import check_can_create_in, refuse_existing, write_files_atomic
from landcover.prediction.outfiles import to_cog
from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_CLASS_NAMES
from landcover.view.mapfile import MapFile, open_map
from tiling.classes import NODATA_CODE
from tiling.shared.atomic import text_writer
from tiling.shared.urls import is_local

__all__ = [
    "CHANGE_FILES",
    "ChangeConfig",
    "check_change_target",
    "check_grids",
    "run_change",
]

logger = logging.getLogger(__name__)

CHANGE_FILES = (CHANGE_MAP, CHANGE_RECORD, "change.md", "change.png")
BLOCK_PX = 1024
M2_PER_KM2 = 1e6
# Grids agree when origins and pixel sizes differ by less than this share of a pixel.
GRID_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class ChangeConfig:
    """What `run_change` compares and where it writes."""

    before: str
    after: str
    out_dir: str
    resample: bool = False
    overwrite: bool = False


def check_change_target(out_dir: str | os.PathLike[str], *, overwrite: bool) -> list[Path]:
    """The output paths in `out_dir`, refused before any work when `out_dir` is a file,
    holds one of them without `overwrite`, or takes no new files."""
    target = Path(out_dir)
    if target.exists() and not target.is_dir():
        raise ChangeError(
            f"--out {target}: exists and is not a directory; give a directory for "
            f"{', '.join(CHANGE_FILES)}"
        )
    paths = [target / name for name in CHANGE_FILES]
    refuse_existing(paths, overwrite=overwrite)
    check_can_create_in(target, option="--out")
    return paths


def _grid_text(m: MapFile) -> str:
    t = m.transform
    return f"{m.width} x {m.height} px of {t.a:g} x {-t.e:g} at ({t.c:.3f}, {t.f:.3f})"


def check_grids(before: MapFile, after: MapFile, *, resample: bool) -> bool:
    """Whether `after` must be warped onto `before`'s grid: False when they share it; True
    with `resample`; otherwise refused in one line naming what differs."""
    fix = "pass --resample to warp AFTER onto BEFORE's grid (nearest neighbour)"
    if before.crs != after.crs:
        if resample:
            return True
        raise ChangeError(
            f"{after.given} is in {after.crs} and {before.given} in {before.crs}; {fix}"
        )
    tol = GRID_TOLERANCE * abs(before.transform.a)
    same = (before.width, before.height) == (after.width, after.height) and all(
        math.isclose(p, q, rel_tol=0, abs_tol=tol)
        for p, q in zip(before.transform[:6], after.transform[:6], strict=True)
    )
    if same:
        return False
    if resample:
        return True
    raise ChangeError(
        f"{after.given} ({_grid_text(after)}) is not on the grid of {before.given} "
        f"({_grid_text(before)}); {fix}"
    )


def _blocks(width: int, height: int) -> list[Window]:
    return [
        Window(col, row, min(BLOCK_PX, width - col), min(BLOCK_PX, height - row))
        for row in range(0, height, BLOCK_PX)
        for col in range(0, width, BLOCK_PX)
    ]


def _profile(m: MapFile) -> dict[str, Any]:
    return {
        "driver": "GTiff",
        "width": m.width,
        "height": m.height,
        "count": 1,
        "dtype": "uint8",
        "crs": m.crs,
        "transform": m.transform,
        "nodata": NODATA_CODE,
        "tiled": True,
        "blockxsize": 512,
        "blockysize": 512,
        "compress": "deflate",
        "zlevel": 1,  # an intermediate file: speed over size
        "bigtiff": "if_safer",
    }


def run_change(config: ChangeConfig) -> Transitions:
    """Compare `config.before` and `config.after` and write the outputs (module docstring);
    the transitions are returned."""
    paths = check_change_target(config.out_dir, overwrite=config.overwrite)
    before = require_whole(open_map(config.before))
    after = require_whole(open_map(config.after))
    check_same_classes(before.class_map, after.class_map, (before.given, after.given))
    warp = check_grids(before, after, resample=config.resample)
    change_map = change_class_map(before.class_map)
    k = before.class_map.num_classes
    counts = np.zeros(256, dtype=np.int64)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=".change-", dir=out) as work,
        rasterio.Env(GDAL_CACHEMAX=128 * 1024 * 1024),
    ):
        tiled = os.path.join(work, "change.tiled.tif")
        with (
            rasterio.open(before.path) as b,
            rasterio.open(after.path) as a,
            rasterio.open(tiled, "w", **_profile(before)) as dst,
        ):
            # the colour table before the first block: GDAL cannot change it mid-write
            dst.write_colormap(1, colormap(change_map))
            dst.set_band_description(1, "land cover change (from-to)")
            dst.update_tags(
                **{
                    TAG_CLASS_MAP: json.dumps(change_map.to_json(), separators=(",", ":")),
                    TAG_CLASS_NAMES: json.dumps(change_map.class_names, ensure_ascii=False),
                }
            )
            source = (
                WarpedVRT(
                    a,
                    crs=before.crs,
                    transform=before.transform,
                    width=before.width,
                    height=before.height,
                    resampling=Resampling.nearest,
                    nodata=NODATA_CODE,
                )
                if warp
                else a
            )
            try:
                for window in _blocks(before.width, before.height):
                    old = b.read(1, window=window)
                    new = source.read(1, window=window)
                    _check_codes(old, before, k)
                    _check_codes(new, after, k)
                    codes = change_codes(old, new, k)
                    counts += np.bincount(codes.ravel(), minlength=256)
                    dst.write(codes, 1, window=window)
            finally:
                if warp:
                    source.close()
        cog = os.path.join(work, "change.cog.tif")
        to_cog(tiled, cog, resampling="MODE")
        transitions = Transitions.from_change_counts(
            counts,
            before=_absolute(before.given),
            after=_absolute(after.given),
            class_map=before.class_map,
            pixel_km2=pixel_area_m2(before) / M2_PER_KM2,
            resampled=warp,
        )
        png = transitions_png(transitions)
        write_files_atomic(
            [
                (paths[0], lambda tmp: os.replace(cog, tmp)),
                (paths[1], text_writer(json.dumps(transitions.to_json(), indent=2) + "\n")),
                (paths[2], text_writer(transitions.to_markdown(title=_title(before, after)))),
                (paths[3], lambda tmp: Path(tmp).write_bytes(png)),
            ],
            overwrite=config.overwrite,
        )
    return transitions


def _absolute(given: str) -> str:
    """A local path made absolute (the record is read from other directories), URLs as
    given."""
    return os.path.abspath(given) if is_local(given) else given


def _title(before: MapFile, after: MapFile) -> str:
    return f"Change from {before.name} to {after.name}"


def _check_codes(codes: np.ndarray, m: MapFile, k: int) -> None:
    if codes.size and int(codes.max()) >= k:
        outside = np.flatnonzero(np.bincount(codes.ravel(), minlength=256)[k:]) + k
        raise ChangeError(
            f"{m.given}: holds class codes {', '.join(str(int(c)) for c in outside[:8])} "
            f"outside its class table {m.class_map.name!r} (codes 0-{k - 1}); compare maps "
            "written by `landcover predict`"
        )
