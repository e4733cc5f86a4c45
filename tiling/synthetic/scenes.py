"""Realistic synthetic NAIP-like scenes with Chesapeake-style 1 m land-cover labels.

The scenes are windows cut from ONE continuous world, so rivers, roads and forests cross
scene edges while only one scene is ever held in memory:

- smooth fields (forest, lakes, development, texture, haze) are hashed-lattice value noise,
  a pure function of world coordinates and the seed;
- parcels (Voronoi cells of a jittered grid), rivers, roads and buildings are vector layers
  built once for the whole world and rasterized per scene.

Geometry lives in world metres, x east and y south of the world's top-left corner; each scene
is rendered with a margin so blurs and shadows see across its edges.

This module holds the configuration, the file names and the writing; the surfaces are in
`tiling.synthetic.surfaces`, the world in `tiling.synthetic.world`, one scene's rendering in
`tiling.synthetic.render`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.errors import CRSError
from rasterio.io import DatasetWriter
from rasterio.warp import reproject, transform_bounds
from rasterio.warp import transform as transform_points
from tqdm import tqdm

from tiling.errors import TilingError
from tiling.runtime.atomic import replaced_when_done
from tiling.sources.classes import CHESAPEAKE_CLASSES
from tiling.synthetic.render import MARGIN_PX, apply_nodata, render_scene
from tiling.synthetic.surfaces import IMAGE_NODATA, LABEL_NODATA
from tiling.synthetic.world import build_world, crc

logger = logging.getLogger(__name__)

BAND_NAMES = ("red", "green", "blue", "nir")
BLOCK_PX = 512
# Near Annapolis, MD in UTM 18N: Chesapeake NAIP country. The same numbers are valid in any zone.
_ORIGIN_E, _ORIGIN_N = 370_000.0, 4_300_000.0
_FIRST_FLIGHT = date(2018, 6, 1)
_MAX_AREA_KM2 = 2500  # the world's vector layers (parcels, roads, houses) are held in memory


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """What `synthesize_scenes` writes: `scenes` adjacent square scenes of `size_px` pixels."""

    out_dir: Path
    scenes: int = 4
    size_px: int = 2048  # each scene is size_px x size_px
    seed: int = 0  # same seed, same bytes
    resolution_m: float = 1.0
    epsg: int = 26918  # a northern UTM zone, like NAIP (26918: NAD83 / UTM 18N)
    label_epsg: int | None = None  # None: labels on the image grid; else reprojected (nearest)
    # into that CRS at the same resolution, e.g. 5070 (Albers) like Chesapeake's 1 m product


@dataclass(frozen=True, slots=True)
class SynthResult:
    """The files written, in scene order (row by row, west to east), and their union."""

    image_paths: list[Path]
    label_paths: list[Path]
    bounds: tuple[float, float, float, float]  # (west, south, east, north) in the image CRS
    crs: str  # of the images, e.g. "EPSG:26918"


def synthesize_scenes(config: SynthConfig) -> SynthResult:
    """Write NAIP-like scenes to OUT/naip/*.tif and their labels to OUT/labels/*_lc.tif.

    Scene k sits at row k // cols, column k % cols of a grid with ceil(sqrt(scenes)) columns.
    Each file is written under a temporary name and renamed once complete; a rerun with the
    same config rewrites the same bytes.
    """
    crs, label_crs = _validate(config)
    cols = math.ceil(math.sqrt(config.scenes))
    rows = math.ceil(config.scenes / cols)
    size, res = config.size_px, config.resolution_m
    with rasterio.Env(GDAL_PAM_ENABLED="NO"):  # no .aux.xml beside files we rename
        names = _scene_names(config, crs, cols)
        naip_dir, label_dir = scene_folders(config.out_dir)
        image_paths = [naip_dir / name for name in names]
        label_paths = [label_dir / name.replace(".tif", "_lc.tif") for name in names]
        _check_no_foreign_rasters(naip_dir, image_paths)
        _check_no_foreign_rasters(label_dir, label_paths)
        naip_dir.mkdir(parents=True, exist_ok=True)
        label_dir.mkdir(parents=True, exist_ok=True)

        started = time.perf_counter()
        world = build_world(config.seed, rows * size * res, cols * size * res)
        logger.info("built the world in %.2f s", time.perf_counter() - started)
        scene_seeds = np.random.SeedSequence([config.seed, crc("scenes")]).spawn(config.scenes)
        tty = sys.stderr.isatty()
        for k in tqdm(range(config.scenes), desc="synth", unit="scene", disable=not tty):
            started = time.perf_counter()
            row0, col0 = (k // cols) * size, (k % cols) * size
            rng = np.random.default_rng(scene_seeds[k])
            image, labels = render_scene(world, row0, col0, size, res, rng)
            apply_nodata(image, labels, k, config.scenes, size)
            west, north = _ORIGIN_E + col0 * res, _ORIGIN_N - row0 * res
            _write_image(image_paths[k], image, Affine(res, 0, west, 0, -res, north), crs, k)
            padded = Affine(res, 0, west - MARGIN_PX * res, 0, -res, north + MARGIN_PX * res)
            _write_labels(label_paths[k], labels, padded, crs, label_crs, size)
            logger.info(
                "scene %d/%d %s in %.2f s",
                k + 1,
                config.scenes,
                names[k],
                time.perf_counter() - started,
            )
    bounds = (_ORIGIN_E, _ORIGIN_N - rows * size * res, _ORIGIN_E + cols * size * res, _ORIGIN_N)
    return SynthResult(image_paths, label_paths, bounds, crs.to_string())


# --- configuration and names -------------------------------------------------------------


def scene_folders(out_dir: Path) -> tuple[Path, Path]:
    """The folders `synthesize_scenes` writes into: (OUT/naip, OUT/labels)."""
    return Path(out_dir) / "naip", Path(out_dir) / "labels"


def _validate(config: SynthConfig) -> tuple[CRS, CRS | None]:
    # the options of `landcover synth` (--scenes, --size, --seed) are named as its flags; the
    # others exist in Python only and are named as fields
    if config.scenes < 1:
        raise TilingError(f"--scenes {config.scenes}: need at least 1 scene")
    if not 64 <= config.size_px <= 16384:
        raise TilingError(f"--size {config.size_px}: choose a scene size of 64..16384 pixels")
    if not (math.isfinite(config.resolution_m) and 0.25 <= config.resolution_m <= 5):
        raise TilingError(
            f"resolution_m={config.resolution_m}: NAIP is 0.6 to 2 m; choose 0.25..5 m"
        )
    area_km2 = config.scenes * (config.size_px * config.resolution_m / 1000) ** 2
    if area_km2 > _MAX_AREA_KM2:
        raise TilingError(
            f"--scenes {config.scenes} x --size {config.size_px} at {config.resolution_m} m cover "
            f"{area_km2:.0f} km2; keep it under {_MAX_AREA_KM2} km2 with fewer or smaller scenes"
        )
    if config.seed < 0:
        raise TilingError(f"--seed {config.seed}: the seed must be a non-negative integer")
    if not (26901 <= config.epsg <= 26923 or 32601 <= config.epsg <= 32660):
        raise TilingError(
            f"epsg={config.epsg}: NAIP is in UTM; use a northern UTM zone such as 26918 "
            "(NAD83 / UTM 18N) or 32618 (WGS 84 / UTM 18N)"
        )
    label_crs = None
    if config.label_epsg is not None:
        try:
            label_crs = CRS.from_epsg(config.label_epsg)
        except CRSError:
            raise TilingError(
                f"label_epsg={config.label_epsg}: not a known EPSG code; use e.g. 5070 (Albers)"
            ) from None
        if not label_crs.is_projected or abs(label_crs.linear_units_factor[1] - 1.0) > 1e-9:
            raise TilingError(
                f"label_epsg={config.label_epsg}: labels need a projected CRS in metres, "
                "e.g. 5070 (NAD83 / Conus Albers)"
            )
    return CRS.from_epsg(config.epsg), label_crs


def _scene_names(config: SynthConfig, crs: CRS, cols: int) -> list[str]:
    """NAIP quarter-quad names, e.g. m_3807612_ne_18_100_20180704.tif.

    Scenes are smaller than a quarter quad (3.75' square), so scene (row, col) takes the
    quarter quad `row` south and `col` east of the one holding the first scene's centre:
    names stay unique, valid and in the same order as the scenes.
    """
    half = config.size_px * config.resolution_m / 2
    (lon,), (lat,) = transform_points(crs, "EPSG:4326", [_ORIGIN_E + half], [_ORIGIN_N - half])
    step = 3.75 / 60
    qy, qx = math.floor(lat / step), math.floor(lon / step)
    zone = config.epsg % 100
    res_code = f"{round(config.resolution_m * 100):03d}"
    rng = np.random.default_rng([config.seed, crc("dates")])
    days = rng.integers(0, 120, size=config.scenes)
    names = []
    for k in range(config.scenes):
        lat_c = (qy - k // cols + 0.5) * step
        lon_c = (qx + k % cols + 0.5) * step
        lat_deg, lon_deg = math.floor(lat_c), math.floor(-lon_c)
        row_f = (lat_deg + 1 - lat_c) / 0.125
        col_f = (lon_c + lon_deg + 1) / 0.125
        quad = math.floor(row_f) * 8 + math.floor(col_f) + 1
        quarter = ("n" if row_f % 1 < 0.5 else "s") + ("w" if col_f % 1 < 0.5 else "e")
        flown = _FIRST_FLIGHT + timedelta(days=int(days[k]))
        names.append(
            f"m_{lat_deg:02d}{lon_deg:03d}{quad:02d}_{quarter}_{zone}_{res_code}_{flown:%Y%m%d}.tif"
        )
    return names


def _check_no_foreign_rasters(folder: Path, ours: Sequence[Path]) -> None:
    if folder.exists() and not folder.is_dir():
        raise TilingError(f"{folder}: exists and is not a folder; choose another output folder")
    if not folder.is_dir():
        return
    foreign = sorted(set(folder.glob("*.tif")) - set(ours))
    if foreign:
        raise TilingError(
            f"{folder} holds {len(foreign)} other .tif file(s) (e.g. {foreign[0].name}) that "
            "would mix with the synthetic scenes; choose an empty output folder or remove them"
        )
    # A rerun rewrites its own files; a link or a folder at one of their names is not one.
    for path in ours:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            kind = "a symbolic link" if path.is_symlink() else "not a file"
            raise TilingError(
                f"{path} is {kind}, so not a scene an earlier run wrote; choose an empty "
                "output folder or remove it"
            )


# --- writing -------------------------------------------------------------------------------


@contextmanager
def _create_geotiff(
    path: Path, like: npt.NDArray[np.uint8], **profile: Any
) -> Iterator[DatasetWriter]:
    """A tiled, deflated GeoTIFF shaped like `like` ((bands, rows, cols) or (rows, cols)), open
    for writing under a temporary name, renamed to `path` only once it is complete and closed."""
    count, height, width = like.shape if like.ndim == 3 else (1, *like.shape)
    with (
        replaced_when_done(path) as tmp,
        rasterio.open(
            tmp,
            "w",
            driver="GTiff",
            width=width,
            height=height,
            count=count,
            dtype=like.dtype.name,
            tiled=True,
            blockxsize=BLOCK_PX,
            blockysize=BLOCK_PX,
            compress="deflate",
            zlevel=1,  # as small as level 6 with the predictor, twice as fast
            interleave="pixel",
            **profile,
        ) as dst,
    ):
        yield dst


def _write_image(
    path: Path, image: npt.NDArray[np.uint8], transform: Affine, crs: CRS, k: int
) -> None:
    with _create_geotiff(
        path,
        image,
        crs=crs,
        transform=transform,
        nodata=IMAGE_NODATA,
        photometric="RGB",
        predictor=2,
    ) as dst:
        dst.write(image)
        dst.colorinterp = (
            ColorInterp.red,
            ColorInterp.green,
            ColorInterp.blue,
            ColorInterp.undefined,
        )
        for i, name in enumerate(BAND_NAMES, start=1):
            dst.set_band_description(i, name)
        dst.update_tags(SOURCE="landcover synthetic NAIP-like scene", SCENE=str(k))


def _write_labels(
    path: Path,
    padded: npt.NDArray[np.uint8],
    padded_transform: Affine,
    crs: CRS,
    label_crs: CRS | None,
    size: int,
) -> None:
    """Labels on the image grid, or reprojected (nearest) onto a grid of the same resolution
    in `label_crs` that covers the image footprint, as the Chesapeake 1 m product is."""
    m = MARGIN_PX
    if label_crs is None:
        labels, transform = padded[m:-m, m:-m], padded_transform @ Affine.translation(m, m)
    else:
        labels, transform = _reproject_labels(padded, padded_transform, crs, label_crs, size)
    with _create_geotiff(
        path,
        labels,
        crs=crs if label_crs is None else label_crs,
        transform=transform,
        nodata=LABEL_NODATA,
    ) as dst:
        dst.write_colormap(1, {c.code: (*c.color, 255) for c in CHESAPEAKE_CLASSES[1:]})
        dst.write(labels, 1)
        dst.set_band_description(1, "land cover (Chesapeake codes, 15 = nodata)")
        dst.update_tags(**{f"CLASS_{c.code}": c.name for c in CHESAPEAKE_CLASSES[1:]})


def _reproject_labels(
    padded: npt.NDArray[np.uint8],
    padded_transform: Affine,
    crs: CRS,
    label_crs: CRS,
    size: int,
) -> tuple[npt.NDArray[np.uint8], Affine]:
    """The labels on the smallest `label_crs` grid of the same resolution, aligned to whole
    multiples of it, that holds the image footprint; nodata outside the padded labels."""
    m, res = MARGIN_PX, padded_transform.a
    west, north = padded_transform @ (m, m)
    footprint = transform_bounds(
        crs, label_crs, west, north - size * res, west + size * res, north, densify_pts=21
    )
    x0, y0 = math.floor(footprint[0] / res) * res, math.floor(footprint[1] / res) * res
    x1, y1 = math.ceil(footprint[2] / res) * res, math.ceil(footprint[3] / res) * res
    transform = Affine(res, 0, x0, 0, -res, y1)
    labels = np.full((round((y1 - y0) / res), round((x1 - x0) / res)), LABEL_NODATA, np.uint8)
    reproject(
        padded,
        labels,
        src_transform=padded_transform,
        src_crs=crs,
        src_nodata=LABEL_NODATA,
        dst_transform=transform,
        dst_crs=label_crs,
        dst_nodata=LABEL_NODATA,
        resampling=Resampling.nearest,
    )
    return labels, transform
