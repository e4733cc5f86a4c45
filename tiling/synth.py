"""Realistic synthetic NAIP-like scenes with Chesapeake-style 1 m land-cover labels.

The scenes are windows cut from ONE continuous world, so rivers, roads and forests cross
scene edges while only one scene is ever held in memory:

- smooth fields (forest, lakes, development, texture, haze) are hashed-lattice value noise,
  a pure function of world coordinates and the seed;
- parcels (Voronoi cells of a jittered grid), rivers, roads and buildings are vector layers
  built once for the whole world and rasterized per scene.

Geometry lives in world metres, x east and y south of the world's top-left corner; each scene
is rendered with a margin so blurs and shadows see across its edges.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import shapely
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import ColorInterp, Resampling
from rasterio.errors import CRSError
from rasterio.features import rasterize
from rasterio.io import DatasetWriter
from rasterio.warp import reproject, transform_bounds
from rasterio.warp import transform as transform_points
from tqdm import tqdm

from tiling.classes import CHESAPEAKE_CLASSES, CHESAPEAKE_NODATA_RAW
from tiling.errors import TilingError
from tiling.noise import NoiseField

logger = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

WATER, TREE, LOW_VEG, BARREN, IMPERVIOUS, ROAD = 1, 2, 3, 4, 5, 6
LABEL_NODATA = CHESAPEAKE_NODATA_RAW
IMAGE_NODATA = 0
BAND_NAMES = ("red", "green", "blue", "nir")
BLOCK_PX = 512

# Near Annapolis, MD in UTM 18N: Chesapeake NAIP country. The same numbers are valid in any zone.
_ORIGIN_E, _ORIGIN_N = 370_000.0, 4_300_000.0
_MARGIN_PX = 24
_FIRST_FLIGHT = date(2018, 6, 1)
_MAX_AREA_KM2 = 2500  # the world's vector layers (parcels, roads, houses) are held in memory

# Surfaces: (name, label, mean R, G, B, NIR digital numbers, within-object variation in DN,
# fine-texture amplitude, NIR vigour in DN). Class overlaps are deliberate: NDVI of trees meets
# that of crops, pasture and lawns (trees are darker and textured instead), soil meets concrete
# and roofs in RGB, shadowed fields meet turbid water in NIR.
_SURFACES: tuple[tuple[str, int, tuple[float, float, float, float], float, float, float], ...] = (
    ("nodata", LABEL_NODATA, (0, 0, 0, 0), 0, 0, 0),
    ("water", WATER, (38, 52, 58, 20), 4, 0.03, 0),
    ("deciduous", TREE, (62, 84, 64, 146), 10, 0.40, 34),
    ("conifer", TREE, (46, 64, 56, 112), 8, 0.40, 26),
    ("crop_green", LOW_VEG, (72, 102, 64, 172), 12, 0.04, 26),
    ("crop_yellow", LOW_VEG, (120, 126, 90, 150), 12, 0.05, 20),
    ("pasture", LOW_VEG, (92, 114, 82, 160), 12, 0.07, 26),
    ("hay", LOW_VEG, (142, 138, 108, 130), 12, 0.07, 16),
    ("lawn", LOW_VEG, (84, 110, 78, 162), 10, 0.08, 26),
    ("soil", BARREN, (140, 120, 100, 126), 14, 0.08, 6),
    ("gravel", BARREN, (166, 158, 146, 150), 10, 0.10, 0),
    ("roof_light", IMPERVIOUS, (170, 168, 164, 156), 6, 0.03, 0),
    ("roof_dark", IMPERVIOUS, (82, 82, 86, 78), 6, 0.03, 0),
    ("roof_red", IMPERVIOUS, (150, 92, 80, 98), 6, 0.03, 0),
    ("roof_white", IMPERVIOUS, (220, 220, 216, 204), 6, 0.03, 0),
    ("parking", IMPERVIOUS, (118, 118, 116, 110), 8, 0.05, 0),
    ("asphalt", ROAD, (84, 84, 88, 80), 6, 0.06, 0),
    ("concrete", ROAD, (148, 146, 140, 134), 6, 0.05, 0),
)
_MAT = {name: i for i, (name, *_rest) in enumerate(_SURFACES)}
_LABEL_OF = np.array([s[1] for s in _SURFACES], dtype=np.uint8)
_MEAN = np.array([s[2] for s in _SURFACES], dtype=np.float32).T.copy()  # (4, surfaces)
_VARIATION = np.array([s[3] for s in _SURFACES], dtype=np.float32)
_TEXTURE = np.array([s[4] for s in _SURFACES], dtype=np.float32)
_VIGOUR = np.array([s[5] for s in _SURFACES], dtype=np.float32)
_TURBID_WATER = np.array([92, 102, 86, 58], dtype=np.float32)
_VARIATION_GAIN = np.array([0.8, 0.9, 0.7, 1.0], dtype=np.float32)
_VIGOUR_GAIN = np.array([-0.25, 0.1, -0.1, 1.0], dtype=np.float32)  # healthy: more NIR, less red
_SHADOW_GAIN = np.array([0.55, 0.56, 0.60, 0.48], dtype=np.float32)
_CROPS = ("crop_green", "crop_yellow", "pasture", "hay", "soil")
_CROP_SHARE = (0.28, 0.18, 0.28, 0.20, 0.06)
_ROOFS = ("roof_light", "roof_dark", "roof_red", "roof_white")


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
        naip_dir, label_dir = Path(config.out_dir) / "naip", Path(config.out_dir) / "labels"
        image_paths = [naip_dir / name for name in names]
        label_paths = [label_dir / name.replace(".tif", "_lc.tif") for name in names]
        _check_no_foreign_rasters(naip_dir, image_paths)
        _check_no_foreign_rasters(label_dir, label_paths)
        naip_dir.mkdir(parents=True, exist_ok=True)
        label_dir.mkdir(parents=True, exist_ok=True)

        started = time.perf_counter()
        world = _build_world(config.seed, rows * size * res, cols * size * res)
        logger.info("built the world in %.2f s", time.perf_counter() - started)
        scene_seeds = np.random.SeedSequence([config.seed, _crc("scenes")]).spawn(config.scenes)
        tty = sys.stderr.isatty()
        for k in tqdm(range(config.scenes), desc="synth", unit="scene", disable=not tty):
            started = time.perf_counter()
            row0, col0 = (k // cols) * size, (k % cols) * size
            rng = np.random.default_rng(scene_seeds[k])
            image, labels = _render_scene(world, row0, col0, size, res, rng)
            _apply_nodata(image, labels, k, config.scenes, size)
            west, north = _ORIGIN_E + col0 * res, _ORIGIN_N - row0 * res
            _write_image(image_paths[k], image, Affine(res, 0, west, 0, -res, north), crs, k)
            padded = Affine(res, 0, west - _MARGIN_PX * res, 0, -res, north + _MARGIN_PX * res)
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


def _validate(config: SynthConfig) -> tuple[CRS, CRS | None]:
    if config.scenes < 1:
        raise TilingError(f"scenes={config.scenes}: need at least 1 scene")
    if not 64 <= config.size_px <= 16384:
        raise TilingError(f"size_px={config.size_px}: choose a scene size of 64..16384 pixels")
    if not (math.isfinite(config.resolution_m) and 0.25 <= config.resolution_m <= 5):
        raise TilingError(
            f"resolution_m={config.resolution_m}: NAIP is 0.6 to 2 m; choose 0.25..5 m"
        )
    area_km2 = config.scenes * (config.size_px * config.resolution_m / 1000) ** 2
    if area_km2 > _MAX_AREA_KM2:
        raise TilingError(
            f"scenes={config.scenes} x size_px={config.size_px} at {config.resolution_m} m cover "
            f"{area_km2:.0f} km2; keep it under {_MAX_AREA_KM2} km2 with fewer or smaller scenes"
        )
    if config.seed < 0:
        raise TilingError(f"seed={config.seed}: the seed must be a non-negative integer")
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
    rng = np.random.default_rng([config.seed, _crc("dates")])
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


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


# --- smooth fields (see tiling.noise) ------------------------------------------------------

_FOREST = NoiseField("forest", 420.0, 5)
_LAKE = NoiseField("lake", 650.0, 4)
_DEVELOPED = NoiseField("developed", 900.0, 2)
_BARREN_PATCH = NoiseField("barren", 140.0, 3)
_CONIFER = NoiseField("conifer", 300.0, 1)
_URBAN_TREES = NoiseField("urban_trees", 16.0, 2)
_DETAIL = NoiseField("detail", 40.0, 1)
_VIGOUR_FIELD = NoiseField("vigour", 90.0, 2)
_TURBIDITY = NoiseField("turbidity", 350.0, 2)
_HAZE = NoiseField("haze", 700.0, 1)
_CROWN = NoiseField("crown", 6.0, 2)


# --- the world: thresholds and vector layers -----------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layer:
    """Polygons with a surface and a DN tint each; `offset` places the tints in `_World.tints`."""

    geoms: npt.NDArray[np.object_]
    surface: npt.NDArray[np.uint8]
    offset: int

    def burn(self, window: _Window) -> npt.NDArray[np.int32]:
        """1 + index of the polygon covering each pixel of the window, 0 where none does."""
        hits = np.flatnonzero(shapely.intersects(self.geoms, window.box))
        if hits.size == 0:
            return np.zeros(window.shape, dtype=np.int32)
        return rasterize(  # type: ignore[no-any-return]
            zip(self.geoms[hits], (hits + 1).tolist(), strict=True),
            out_shape=window.shape,
            transform=window.transform,
            fill=0,
            dtype="int32",
        )


@dataclass(frozen=True, slots=True)
class _World:
    seed: int
    thresholds: dict[str, float]
    parcels: _Layer
    hedges: _Layer
    waterways: _Layer
    riparian: _Layer
    parking: _Layer
    buildings: _Layer
    roads: _Layer
    tints: F32  # (4, 1 + all tinted polygons); column 0 is no tint


@dataclass(frozen=True, slots=True)
class _Window:
    """A pixel window of the world grid (with margin) in world metres, x east, y south."""

    row0: int
    col0: int
    height: int
    width: int
    res_m: float

    @property
    def shape(self) -> tuple[int, int]:
        return (self.height, self.width)

    @property
    def transform(self) -> Affine:
        return Affine(self.res_m, 0, self.col0 * self.res_m, 0, self.res_m, self.row0 * self.res_m)

    @property
    def box(self) -> shapely.Polygon:
        r = self.res_m
        return shapely.box(
            self.col0 * r,
            self.row0 * r,
            (self.col0 + self.width) * r,
            (self.row0 + self.height) * r,
        )

    def centres(self) -> tuple[F64, F64]:
        r = self.res_m
        x = (np.arange(self.width, dtype=np.float64) + self.col0 + 0.5) * r
        y = (np.arange(self.height, dtype=np.float64) + self.row0 + 0.5) * r
        return x, y


def _build_world(seed: int, height_m: float, width_m: float) -> _World:
    rngs = [
        np.random.default_rng(s) for s in np.random.SeedSequence([seed, _crc("world")]).spawn(4)
    ]
    thresholds = _thresholds(seed, height_m, width_m)
    parcels, parcel_tints, hedges = _parcels(rngs[0], seed, height_m, width_m, thresholds)
    waterways, riparian = _waterways(rngs[1], height_m, width_m)
    road_lines, road_half_widths, roads_surface = _roads(
        rngs[2], seed, height_m, width_m, thresholds
    )
    road_polys = shapely.buffer(road_lines, road_half_widths)
    buildings, roofs, parking = _buildings(
        rngs[3], seed, road_lines, road_half_widths, road_polys, waterways, thresholds
    )
    tints = [np.zeros((1, 4), np.float32), parcel_tints]
    layers = []
    for geoms, surface, sd in (
        (parking, np.full(len(parking), _MAT["parking"]), 7.0),
        (buildings, roofs, 10.0),
        (road_polys, roads_surface, 5.0),
    ):
        offset = sum(len(t) for t in tints) - 1
        tints.append(_tints(rngs[3], len(geoms), sd))
        layers.append(_Layer(np.asarray(geoms, dtype=object), surface.astype(np.uint8), offset))
    no_tint = np.zeros(0, dtype=np.uint8)
    return _World(
        seed,
        thresholds,
        parcels,
        _Layer(hedges, no_tint, 0),
        _Layer(waterways, no_tint, 0),
        _Layer(riparian, no_tint, 0),
        parking=layers[0],
        buildings=layers[1],
        roads=layers[2],
        tints=np.concatenate(tints).T.copy(),
    )


def _thresholds(seed: int, height_m: float, width_m: float) -> dict[str, float]:
    """Field levels that give each cover its share of the whole world (not per scene, so
    forests keep their edges across scenes), from a coarse preview of the world."""
    step = max(8.0, max(height_m, width_m) / 400)
    x = (np.arange(math.ceil(width_m / step), dtype=np.float64) + 0.5) * step
    y = (np.arange(math.ceil(height_m / step), dtype=np.float64) + 0.5) * step
    forest, lake = _FOREST.on_grid(seed, x, y), _LAKE.on_grid(seed, x, y)
    developed, barren = _DEVELOPED.on_grid(seed, x, y), _BARREN_PATCH.on_grid(seed, x, y)
    return {
        "forest": float(np.quantile(forest, 0.70)),
        "riparian": float(np.quantile(forest, 0.30)),
        "lake": float(np.quantile(lake, 0.955)),
        "developed": float(np.quantile(developed, 0.68)),
        "commercial": float(np.quantile(developed, 0.94)),
        "barren": float(np.quantile(barren, 0.985)),
    }


def _tints(rng: np.random.Generator, n: int, sd: float) -> F32:
    """Per-object DN offsets: mostly a shared brightness shift, a little per band."""
    return (rng.normal(0, sd, (n, 1)) + rng.normal(0, sd / 2, (n, 4))).astype(np.float32)


def _parcels(
    rng: np.random.Generator, seed: int, height_m: float, width_m: float, t: dict[str, float]
) -> tuple[_Layer, F32, npt.NDArray[np.object_]]:
    """Fields as Voronoi cells of a jittered grid, each with a crop; hedgerows on some edges."""
    cell, pad = 190.0, 400.0
    gx, gy = np.meshgrid(
        np.arange(math.ceil((width_m + 2 * pad) / cell)),
        np.arange(math.ceil((height_m + 2 * pad) / cell)),
    )
    jitter = rng.uniform(-0.38, 0.38, (2, *gx.shape))
    pts = np.stack(
        [(gx + 0.5 + jitter[0]) * cell - pad, (gy + 0.5 + jitter[1]) * cell - pad], axis=-1
    ).reshape(-1, 2)
    extent = shapely.box(-pad, -pad, width_m + pad, height_m + pad)
    cells = shapely.get_parts(
        shapely.voronoi_polygons(shapely.multipoints(pts), extend_to=extent, ordered=True)
    )
    polys = shapely.intersection(cells, extent)
    crop = rng.choice(len(_CROPS), size=len(polys), p=_CROP_SHARE)
    surface = np.array([_MAT[c] for c in _CROPS], dtype=np.uint8)[crop]
    rural = _DEVELOPED.at(seed, pts[:, 0], pts[:, 1]) < t["developed"]
    hedged = (rng.random(len(polys)) < 0.35) & rural
    hedges = shapely.buffer(shapely.boundary(polys[hedged]), rng.uniform(2.0, 4.0, hedged.sum()))
    return _Layer(polys, surface, 0), _tints(rng, len(polys), 7.0), hedges


def _meander(
    rng: np.random.Generator,
    start: tuple[float, float],
    heading: float,
    *,
    step_m: float,
    wiggle: float,
    pull: float,
    extent: shapely.Polygon,
) -> shapely.LineString:
    """A random walk whose heading drifts (AR(1)) around `heading`: rivers and country roads."""
    x0, y0, x1, y1 = extent.bounds
    max_steps = int(4 * ((x1 - x0) + (y1 - y0)) / step_m) + 10
    kicks = rng.normal(0, wiggle, max_steps)
    pts, (x, y), drift = [start], start, 0.0
    for kick in kicks:
        drift = float(np.clip(drift * (1 - pull) + kick, -1.2, 1.2))
        x, y = x + step_m * math.cos(heading + drift), y + step_m * math.sin(heading + drift)
        pts.append((x, y))
        if not (x0 <= x <= x1 and y0 <= y <= y1):
            break
    return shapely.LineString(pts)


def _waterways(
    rng: np.random.Generator, height_m: float, width_m: float
) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_]]:
    """A meandering river west to east and a creek north to south, with their riparian zones."""
    extent = shapely.box(-300, -300, width_m + 300, height_m + 300)
    river = _meander(
        rng,
        (-300.0, rng.uniform(0.3, 0.7) * height_m),
        0.0,
        step_m=12,
        wiggle=0.18,
        pull=0.08,
        extent=extent,
    )
    creek = _meander(
        rng,
        (rng.uniform(0.2, 0.8) * width_m, -300.0),
        math.pi / 2,
        step_m=8,
        wiggle=0.25,
        pull=0.1,
        extent=extent,
    )
    half_widths = np.array([rng.uniform(9, 15), rng.uniform(2.5, 4.0)])
    lines = np.array([river, creek], dtype=object)
    riparian = shapely.buffer(lines, half_widths + np.array([40.0, 20.0]))
    return shapely.buffer(lines, half_widths), riparian


def _roads(
    rng: np.random.Generator, seed: int, height_m: float, width_m: float, t: dict[str, float]
) -> tuple[npt.NDArray[np.object_], F64, npt.NDArray[np.uint8]]:
    """Country roads across the world and a rotated street grid where the land is developed."""
    extent = shapely.box(-200, -200, width_m + 200, height_m + 200)
    country_road = partial(_meander, rng, step_m=25, wiggle=0.04, pull=0.05, extent=extent)
    lines: list[shapely.LineString] = []
    n_ew, n_ns = max(1, round(height_m / 1500)), max(1, round(width_m / 1500))
    for i in range(n_ew):
        y = (i + rng.uniform(0.2, 0.8)) * height_m / n_ew
        lines.append(country_road((-200.0, y), 0.0))
    for i in range(n_ns):
        x = (i + rng.uniform(0.2, 0.8)) * width_m / n_ns
        lines.append(country_road((x, -200.0), math.pi / 2))
    half_widths = list(rng.uniform(5.0, 6.0, len(lines)))

    spacing, angle = rng.uniform(170, 230), rng.uniform(-0.35, 0.35)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    corners = shapely.get_coordinates(extent) @ rot  # into the grid's frame
    lo, hi = np.floor(corners.min(0) / spacing), np.ceil(corners.max(0) / spacing)
    gi, gj = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1))
    nodes = (np.stack([gi, gj], -1) + rng.uniform(-0.15, 0.15, (*gi.shape, 2))) * spacing
    nodes = nodes @ rot.T  # back to world metres
    starts = np.concatenate([nodes[:, :-1].reshape(-1, 2), nodes[:-1, :].reshape(-1, 2)])
    ends = np.concatenate([nodes[:, 1:].reshape(-1, 2), nodes[1:, :].reshape(-1, 2)])
    mid = (starts + ends) / 2
    keep = _DEVELOPED.at(seed, mid[:, 0], mid[:, 1]) > t["developed"]
    streets = shapely.linestrings(np.stack([starts[keep], ends[keep]], axis=1))
    lines.extend(streets)
    half_widths.extend(rng.uniform(3.0, 4.0, len(streets)))
    surface = np.where(rng.random(len(lines)) < 0.8, _MAT["asphalt"], _MAT["concrete"])
    return np.array(lines, dtype=object), np.array(half_widths), surface.astype(np.uint8)


def _buildings(
    rng: np.random.Generator,
    seed: int,
    road_lines: npt.NDArray[np.object_],
    half_widths: F64,
    road_polys: npt.NDArray[np.object_],
    waterways: npt.NDArray[np.object_],
    t: dict[str, float],
) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.uint8], npt.NDArray[np.object_]]:
    """Houses facing the roads in developed land (a few farmhouses elsewhere), big commercial
    buildings with a parking lot in front where development is densest."""
    spacing = 26.0
    points, directions, road_hw = [], [], []
    for line, hw in zip(road_lines, half_widths, strict=True):
        length = float(shapely.length(line))
        dist = np.arange(15.0 + rng.uniform(0, spacing), length - 15.0, spacing)
        if dist.size == 0:
            continue
        here = shapely.get_coordinates(shapely.line_interpolate_point(line, dist))
        ahead = shapely.get_coordinates(shapely.line_interpolate_point(line, dist + 1))
        points.append(here)
        directions.append((ahead - here) / np.linalg.norm(ahead - here, axis=1, keepdims=True))
        road_hw.append(np.full(len(dist), hw))
    p = np.concatenate(points * 2)
    u = np.concatenate(directions * 2)
    side = np.repeat([1.0, -1.0], len(p) // 2)[:, None]
    hw = np.concatenate(road_hw * 2)[:, None]
    n = np.stack([-u[:, 1], u[:, 0]], axis=1) * side

    level = _DEVELOPED.at(seed, p[:, 0], p[:, 1])
    commercial = level > t["commercial"]
    draw = rng.random(len(p))
    keep = np.where(level > t["developed"], draw < np.where(commercial, 0.5, 0.8), draw < 0.03)
    big, shape = commercial[:, None], (len(p), 1)
    along = np.where(big, rng.uniform(25, 55, shape), rng.uniform(9, 17, shape))
    across = np.where(big, rng.uniform(20, 40, shape), rng.uniform(8, 14, shape))
    setback = np.where(big, rng.uniform(22, 35, shape), rng.uniform(6, 14, shape))
    centre = p + n * (hw + setback + across / 2)
    houses = _rectangles(centre, u, n, along, across)
    lots = _rectangles(p + n * (hw + 2 + (setback - 4) / 2), u, n, along * 1.1, setback - 4)
    roofs = rng.choice([_MAT[r] for r in _ROOFS], size=len(p), p=(0.35, 0.35, 0.15, 0.15))

    in_lake = _LAKE.at(seed, centre[:, 0], centre[:, 1]) > t["lake"] - 0.02
    keep &= ~in_lake
    for obstacles in (road_polys, waterways):
        hits = shapely.STRtree(obstacles).query(houses, predicate="intersects")[0]
        keep[hits] = False
    kept = np.flatnonzero(keep)
    pairs = shapely.STRtree(houses[kept]).query(houses[kept], predicate="intersects")
    keep[kept[np.unique(pairs[1][pairs[0] < pairs[1]])]] = False  # first come, first built
    return houses[keep], roofs[keep].astype(np.uint8), lots[keep & commercial]


def _rectangles(centre: F64, u: F64, n: F64, along: F64, across: F64) -> npt.NDArray[np.object_]:
    du, dn = u * along / 2, n * across / 2
    ring = np.stack(
        [centre - du - dn, centre + du - dn, centre + du + dn, centre - du + dn, centre - du - dn],
        axis=1,
    )
    return shapely.polygons(ring)  # type: ignore[no-any-return]


# --- one scene -----------------------------------------------------------------------------


def _render_scene(
    world: _World, row0: int, col0: int, size: int, res_m: float, rng: np.random.Generator
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The image (4, size, size) and the labels with a margin (size + 2 * margin) squared."""
    m, seed, t = _MARGIN_PX, world.seed, world.thresholds
    window = _Window(row0 - m, col0 - m, size + 2 * m, size + 2 * m, res_m)
    x, y = window.centres()

    tint = world.parcels.burn(window)
    surface = np.concatenate([[_MAT["pasture"]], world.parcels.surface])[tint]
    developed = _DEVELOPED.on_grid(seed, x, y) > t["developed"]
    surface[developed & (_LABEL_OF[surface] == LOW_VEG)] = _MAT["lawn"]
    detail = _DETAIL.on_grid(seed, x, y)
    patch = _BARREN_PATCH.on_grid(seed, x, y) > t["barren"]
    surface[patch] = np.where(detail[patch] > 0, _MAT["gravel"], _MAT["soil"])
    tint[patch] = 0

    forest = _FOREST.on_grid(seed, x, y)
    trees = (forest > t["forest"]) | (world.hedges.burn(window) > 0)
    trees |= (world.riparian.burn(window) > 0) & (forest > t["riparian"])
    trees |= developed & (_URBAN_TREES.on_grid(seed, x, y) > 0.28)  # ~20 % of yards
    conifer = _CONIFER.on_grid(seed, x, y) > 0.15  # ~35 % of stands
    surface[trees] = np.where(conifer[trees], _MAT["conifer"], _MAT["deciduous"])
    water = (_LAKE.on_grid(seed, x, y) > t["lake"]) | (world.waterways.burn(window) > 0)
    surface[water] = _MAT["water"]
    tint[trees | water] = 0
    for layer in (world.parking, world.buildings, world.roads):
        ids = layer.burn(window)
        hit = ids > 0
        surface[hit] = layer.surface[ids[hit] - 1]
        tint[hit] = ids[hit] + layer.offset
    labels = _LABEL_OF[surface]

    # Texture: tree crowns with dark gaps between them, a little grain on everything else.
    crown = _CROWN.on_grid(seed, x, y)
    is_tree = labels == TREE
    gain = 1 + _TEXTURE[surface] * crown
    gain[is_tree & (crown < -0.3)] *= 0.62  # ~20 % of the canopy in the gaps
    gain *= 1 + 0.05 * _HAZE.on_grid(seed, x, y)
    shadow = _shadow(is_tree, round(6 / res_m)) | _shadow(labels == IMPERVIOUS, round(8 / res_m))
    shadow &= ~is_tree
    wy, wx = np.nonzero(water)  # turbidity only where there is water: cheaper than a grid
    turbid = np.clip(0.45 + 1.6 * _TURBIDITY.at(seed, x[wx], y[wy]), 0, 1)
    variation = _VARIATION[surface] * detail
    vigour = _VIGOUR[surface] * _VIGOUR_FIELD.on_grid(seed, x, y)

    image = np.empty((4, size, size), dtype=np.uint8)
    gains = rng.uniform(0.94, 1.06, 4)  # per scene, like separate flight lines
    offsets = rng.uniform(-5, 5, 4)
    for b in range(4):
        band = _MEAN[b][surface]
        band += world.tints[b][tint]
        band += variation * _VARIATION_GAIN[b]
        band += vigour * _VIGOUR_GAIN[b]
        band[water] += turbid * (_TURBID_WATER[b] - _MEAN[b][_MAT["water"]])
        band *= gain
        band[shadow] *= _SHADOW_GAIN[b]
        band = _blur3(band)[m - 1 : 1 - m, m - 1 : 1 - m]
        band += rng.standard_normal(band.shape, dtype=np.float32) * np.float32(2.0)
        band *= np.float32(gains[b])
        band += np.float32(offsets[b])
        image[b] = np.clip(np.rint(band), 1, 255)  # 0 is the image nodata value
    return image, labels


def _shadow(objects: Mask, length_px: int) -> Mask:
    """Pixels north (and a little west) of an object: NAIP is flown near noon."""
    shadow = np.zeros_like(objects)
    for step in range(1, max(length_px, 1) + 1):
        dx = step // 3
        shadow[:-step, : shadow.shape[1] - dx] |= objects[step:, dx:]
    return shadow & ~objects


def _blur3(a: F32) -> F32:
    """1-2-1 binomial blur both ways (the camera's point spread, so edges mix); one pixel
    shorter on every side."""
    v = a[1:-1] * np.float32(2)
    v += a[:-2]
    v += a[2:]
    out = v[:, 1:-1] * np.float32(2)
    out += v[:, :-2]
    out += v[:, 2:]
    out *= np.float32(1 / 16)
    return out


def _apply_nodata(
    image: npt.NDArray[np.uint8], labels: npt.NDArray[np.uint8], k: int, scenes: int, size: int
) -> None:
    """A label-only strip along the world's top edge (outside the label survey) in the first
    scene, and an image nodata corner (edge of the flight) in the last one, both at the
    world's outer edge so every scene seam stays valid."""
    m = _MARGIN_PX
    if k == 0:
        labels[: m + max(3, size // 100), m : m + size] = LABEL_NODATA
    if k == scenes - 1:
        r = np.arange(labels.shape[0]) - m
        corner = (size - 1 - r)[:, None] + (size - 1 - r)[None, :] < size // 8
        labels[corner] = LABEL_NODATA
        image[:, corner[m:-m, m:-m]] = IMAGE_NODATA


# --- writing -------------------------------------------------------------------------------


@contextmanager
def _create_geotiff(path: Path, **profile: Any) -> Iterator[DatasetWriter]:
    """A tiled, deflated GeoTIFF open for writing under a temporary name, renamed to `path`
    only once it is complete and closed."""
    partial = path.with_name(f".{path.name}.partial")
    with rasterio.open(
        partial,
        "w",
        driver="GTiff",
        tiled=True,
        blockxsize=BLOCK_PX,
        blockysize=BLOCK_PX,
        compress="deflate",
        zlevel=1,  # as small as level 6 with the predictor, twice as fast
        interleave="pixel",
        **profile,
    ) as dst:
        yield dst
    os.replace(partial, path)


def _write_image(
    path: Path, image: npt.NDArray[np.uint8], transform: Affine, crs: CRS, k: int
) -> None:
    with _create_geotiff(
        path,
        width=image.shape[2],
        height=image.shape[1],
        count=4,
        dtype="uint8",
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
    m = _MARGIN_PX
    if label_crs is None:
        labels, transform = padded[m:-m, m:-m], padded_transform @ Affine.translation(m, m)
    else:
        labels, transform = _reproject_labels(padded, padded_transform, crs, label_crs, size)
    with _create_geotiff(
        path,
        width=labels.shape[1],
        height=labels.shape[0],
        count=1,
        dtype="uint8",
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
    m, res = _MARGIN_PX, padded_transform.a
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
