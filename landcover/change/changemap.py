"""`landcover change`: two maps of one region and class table on one grid become a change COG
(from-to codes, `landcover.change.transitions`) and the transition matrix, read and written
in blocks so that a state's maps stream.

The maps are COGs, VRTs or tiled products (their `mosaic.vrt`). They must share the CRS and
the pixel grid (transform and size), or the command refuses in one line; with `resample`, the
after map is warped onto the before map's grid (nearest neighbour, a class is never blended)
as it is read. The output directory receives change.tif, change.json (the `Transitions`
record), change.md and change.png, all or none; when BEFORE is a tiled product the change map
is tiled too: a change COG per tile (named as the tile) and mosaic.vrt over them.

The output directory holds one change: anything in it is refused without `overwrite`, and
with it the old change's files (those its record lists) all go, files of no change staying.
change.json is put in place last and the old one removed first, so a run killed midway leaves
no record beside files it did not finish; the next run removes its leftovers.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.shutil
import rasterio.windows
from rasterio.enums import Resampling
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from landcover.change.changedir import (
    CHANGE_REPORTS,
    MOSAIC,
    PENDING,
    SCRATCH_PREFIX,
    check_change_directory,
    claimed,
)
from landcover.change.transitions import (
    CHANGE_MAP,
    CHANGE_RECORD,
    Transitions,
    change_class_map,
    change_codes,
    check_same_classes,
    transitions_png,
)
from landcover.classes import colormap, unknown_codes
from landcover.errors import ChangeError
from landcover.evaluation.sampling import require_whole, window_pixel_m2
from landcover.outputs import (
    check_can_create_in,
    output_directory,
    refuse_existing,
    write_files_atomic,
    write_text_atomic,
)
from landcover.prediction.outfiles import to_cog
from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_CLASS_NAMES
from landcover.prediction.tilevrt import VrtTile, write_tile_vrt
from landcover.view.areas import cell_areas
from landcover.view.mapfile import MapFile, open_map
from landcover.writefailures import raster_write_errors
from tiling.runtime.atomic import text_writer
from tiling.runtime.urls import is_local
from tiling.sources.classes import NODATA_CODE

__all__ = [
    "CHANGE_FILES",
    "CHANGE_REPORTS",
    "MOSAIC",
    "ChangeConfig",
    "check_change_target",
    "check_grids",
    "run_change",
]

logger = logging.getLogger(__name__)

CHANGE_FILES = (CHANGE_MAP, *CHANGE_REPORTS)
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


def check_change_target(
    out_dir: str | os.PathLike[str], *, overwrite: bool, names: Sequence[str] = CHANGE_REPORTS
) -> list[Path]:
    """The paths of the files `names` in `out_dir`, refused before any work when `out_dir` is
    a file, holds one of them without `overwrite`, or takes no new files."""
    target = output_directory(
        out_dir, fix=f"give a directory for {', '.join(CHANGE_FILES)}", error=ChangeError
    )
    paths = [target / name for name in names]
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


@dataclass(frozen=True, slots=True)
class Piece:
    """One file of the change map: its name in the output directory and its window of
    BEFORE's grid (the whole grid, or one tile of a tiled product)."""

    name: str
    window: Window


def _pieces(before: MapFile) -> list[Piece]:
    """A change file per tile of a tiled product (named as its tile), else one change.tif."""
    if not before.path.lower().endswith(".vrt") or not before.parts:
        return [Piece(CHANGE_MAP, Window(0, 0, before.width, before.height))]
    t = before.transform
    pieces = []
    for part in before.parts:
        with rasterio.open(part) as tile:
            u = tile.transform
            col = round((u.c - t.c) / t.a)
            row = round((u.f - t.f) / t.e)
            pieces.append(Piece(Path(part).name, Window(col, row, tile.width, tile.height)))
    names = [p.name for p in pieces]
    if len(set(names)) < len(names) or {MOSAIC, *CHANGE_FILES} & set(names):
        return [Piece(f"change-{i:04d}.tif", p.window) for i, p in enumerate(pieces)]
    return pieces


def _profile(m: MapFile, window: Window) -> dict[str, Any]:
    return {
        "driver": "GTiff",
        "width": int(window.width),
        "height": int(window.height),
        "count": 1,
        "dtype": "uint8",
        "crs": m.crs,
        "transform": rasterio.windows.transform(window, m.transform),
        "nodata": NODATA_CODE,
        "tiled": True,
        "blockxsize": 512,
        "blockysize": 512,
        "compress": "deflate",
        "zlevel": 1,  # an intermediate file: speed over size
        "bigtiff": "if_safer",
    }


class _ChangeWriter:
    """Reads BEFORE and AFTER (warped onto BEFORE's grid when asked) block by block and
    writes the change codes of one piece at a time, counting them."""

    def __init__(self, before: MapFile, after: MapFile, *, warp: bool, work: str) -> None:
        self.before, self.after, self.work = before, after, work
        self.k = before.class_map.num_classes
        self.table = change_class_map(before.class_map)
        self.counts = np.zeros(256, dtype=np.int64)
        self.area_m2 = np.zeros(256, dtype=np.float64)  # on the ellipsoid, per change code
        self.cells = cell_areas(before)
        self.old = rasterio.open(before.path)
        self.new = rasterio.open(after.path)
        self.source = (
            WarpedVRT(
                self.new,
                crs=before.crs,
                transform=before.transform,
                width=before.width,
                height=before.height,
                resampling=Resampling.nearest,
                nodata=NODATA_CODE,
            )
            if warp
            else self.new
        )

    def close(self) -> None:
        if self.source is not self.new:
            self.source.close()
        self.new.close()
        self.old.close()

    def write(self, piece: Piece) -> str:
        """The COG of `piece` in the work directory; its path."""
        tiled = os.path.join(self.work, f"{piece.name}.tiled.tif")
        with rasterio.open(tiled, "w", **_profile(self.before, piece.window)) as dst:
            # the colour table before the first block: GDAL cannot change it mid-write
            dst.write_colormap(1, colormap(self.table))
            dst.set_band_description(1, "land cover change (from-to)")
            dst.update_tags(
                **{
                    TAG_CLASS_MAP: json.dumps(self.table.to_json(), separators=(",", ":")),
                    TAG_CLASS_NAMES: json.dumps(self.table.class_names, ensure_ascii=False),
                }
            )
            w = piece.window
            for local in _blocks(int(w.width), int(w.height)):
                window = Window(
                    w.col_off + local.col_off, w.row_off + local.row_off, local.width, local.height
                )
                old = self.old.read(1, window=window)
                new = self.source.read(1, window=window)
                _check_codes(old, self.before)
                _check_codes(new, self.after)
                codes = change_codes(old, new, self.k)
                self.counts += np.bincount(codes.ravel(), minlength=256)
                weights = window_pixel_m2(self.cells, window).ravel()
                self.area_m2 += np.bincount(codes.ravel(), weights=weights, minlength=256)
                dst.write(codes, 1, window=local)
        cog = os.path.join(self.work, piece.name)
        to_cog(tiled, cog, resampling="MODE")
        os.unlink(tiled)
        return cog


def run_change(config: ChangeConfig) -> Transitions:
    """Compare `config.before` and `config.after` and write the outputs (module docstring);
    the transitions are returned."""
    reports = check_change_target(config.out_dir, overwrite=config.overwrite)
    before = require_whole(open_map(config.before))
    after = require_whole(open_map(config.after))
    check_same_classes(before.class_map, after.class_map, (before.given, after.given))
    warp = check_grids(before, after, resample=config.resample)
    pieces = _pieces(before)
    map_name = CHANGE_MAP if [p.name for p in pieces] == [CHANGE_MAP] else MOSAIC
    names = [*(p.name for p in pieces), *([MOSAIC] if map_name == MOSAIC else [])]
    rasters = check_change_target(config.out_dir, overwrite=config.overwrite, names=names)
    out = Path(config.out_dir)
    old = check_change_directory(out, overwrite=config.overwrite)
    with (
        raster_write_errors(out),  # a full disk or a size limit: one line, after the clean-up
        claimed(out, [*names, *CHANGE_REPORTS, *old]),
        tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=out) as work,
        rasterio.Env(GDAL_CACHEMAX=128 * 1024 * 1024),
    ):
        writer = _ChangeWriter(before, after, warp=warp, work=work)
        try:
            files = [writer.write(piece) for piece in pieces]
        finally:
            writer.close()
        if not writer.counts[1:].any():
            raise ChangeError(
                f"{before.given} and {after.given} share no pixel that both classify (they do "
                "not overlap, or one is all nodata there); compare maps of one region"
            )
        if map_name == MOSAIC:
            files.append(_mosaic(files, pieces, before, work))
        transitions = Transitions.from_change_counts(
            writer.counts,
            before=_absolute(before.given),
            after=_absolute(after.given),
            class_map=before.class_map,
            area_km2=writer.area_m2 / M2_PER_KM2,
            resampled=warp,
            map_name=map_name,
            files=tuple(names),
        )
        png = transitions_png(transitions)
        pending = out / PENDING
        write_text_atomic(pending, json.dumps(sorted({*old, *names, *CHANGE_REPORTS})))
        # no record while the files change: a run killed here leaves nothing to trust
        (out / CHANGE_RECORD).unlink(missing_ok=True)
        write_files_atomic(
            [
                *((path, _mover(made)) for path, made in zip(rasters, files, strict=True)),
                (reports[1], text_writer(transitions.to_markdown(title=_title(before, after)))),
                (reports[2], lambda tmp: Path(tmp).write_bytes(png)),
                # the record last: the commit point of the change
                (reports[0], text_writer(json.dumps(transitions.to_json(), indent=2) + "\n")),
            ],
            overwrite=config.overwrite,
        )
        for name in sorted(old - {*names, *CHANGE_REPORTS}):
            (out / name).unlink(missing_ok=True)  # the old change's files the new one lacks
        pending.unlink()
    return transitions


def _mover(made: str) -> Callable[[str], object]:
    return lambda tmp: os.replace(made, tmp)


def _mosaic(files: Sequence[str], pieces: Sequence[Piece], before: MapFile, work: str) -> str:
    """A VRT of BEFORE's grid over the change tiles (paths relative to it): GDAL's VRT of the
    first tile (its colour table and tags), widened to the grid, a source per tile."""
    tiles = [
        VrtTile(
            p.name,
            int(p.window.row_off),
            int(p.window.col_off),
            int(p.window.height),
            int(p.window.width),
        )
        for p in pieces
    ]
    vrt = os.path.join(work, MOSAIC)
    write_tile_vrt(
        vrt, files[0], tiles, transform=before.transform, width=before.width, height=before.height
    )
    return vrt


def _absolute(given: str) -> str:
    """A local path made absolute (the record is read from other directories), URLs as
    given."""
    return os.path.abspath(given) if is_local(given) else given


def _title(before: MapFile, after: MapFile) -> str:
    return f"Change from {before.name} to {after.name}"


def _check_codes(codes: np.ndarray, m: MapFile) -> None:
    unknown = unknown_codes(codes, m.class_map)
    if unknown is not None:
        raise ChangeError(f"{m.given}: {unknown}; compare maps written by `landcover predict`")
