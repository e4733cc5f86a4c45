"""The tiled map product's tile size (`--tile-size`, `PredictConfig.tile_px`) and its `--out`.

A tiled product is asked for by a directory `--out` (a trailing slash, or an existing local
directory) together with a tile edge in pixels; one COG by a file name without one. The checks
of the tile size are made once, where the prediction's config is built
(`PredictConfig.__post_init__` calls `check_tile_size`); `require_tile_size` refuses a
directory `--out` without one, where a stage is built (`landcover.stageconfig`), so that a
library caller may still give the tile size beside the config (`TiledSetup`). Free of torch
and GDAL, as the config is.
"""

from __future__ import annotations

from pathlib import Path

from landcover.errors import PredictionError

MIN_TILE_PX = 16


def is_tiled_output(out: str) -> bool:
    """Whether `--out` names a tiled product's directory: a trailing slash, or an existing
    local directory."""
    return out.endswith("/") or Path(out.removeprefix("file://")).is_dir()


def check_tile_size(tile_px: int, out: str, max_pixels: int | None) -> None:
    """Refuse (`PredictionError`, one line) a tile size with a file `--out`, below
    `MIN_TILE_PX`, or whose tiles hold more than `max_pixels`."""
    if not is_tiled_output(out):
        raise PredictionError(
            f"--tile-size {tile_px} needs --out to be a directory for the tiles, e.g. "
            f"--out {out.rsplit('.', 1)[0]}/ (with the trailing slash); drop --tile-size "
            "for one COG"
        )
    if tile_px < MIN_TILE_PX:
        raise PredictionError(f"--tile-size {tile_px} px: must be at least {MIN_TILE_PX}")
    if max_pixels is not None and tile_px * tile_px > max_pixels:
        raise PredictionError(
            f"--tile-size {tile_px} px makes tiles of {tile_px * tile_px:,} px, above "
            f"--max-pixels {max_pixels:,}; use smaller tiles or raise --max-pixels"
        )


def require_tile_size(out: str, tile_px: int | None) -> None:
    """Refuse a directory `--out` (a tiled product) given without a tile size."""
    if tile_px is None and is_tiled_output(out):
        raise PredictionError(
            f"--out {out} is a directory (a tiled map product); give --tile-size PX, e.g. "
            "--tile-size 10000, or a file name like lc.tif for one COG"
        )
