"""The world the synthetic scenes (`tiling.synthetic.scenes`) are cut from: smooth fields (see
`tiling.synthetic.noise`), thresholds, and vector layers (parcels, hedges, waterways, roads,
buildings) built once for the whole world and burnt into each scene window.

Geometry lives in world metres, x east and y south of the world's top-left corner.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt
import shapely
from affine import Affine
from rasterio.features import rasterize

from tiling.synthetic.noise import NoiseField
from tiling.synthetic.surfaces import CROP_SHARE, CROPS, MAT, ROOFS

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


# --- smooth fields (see tiling.synthetic.noise) ---------------------------------------------------

FOREST = NoiseField("forest", 420.0, 5)
LAKE = NoiseField("lake", 650.0, 4)
DEVELOPED = NoiseField("developed", 900.0, 2)
BARREN_PATCH = NoiseField("barren", 140.0, 3)
CONIFER = NoiseField("conifer", 300.0, 1)
URBAN_TREES = NoiseField("urban_trees", 16.0, 2)
DETAIL = NoiseField("detail", 40.0, 1)
VIGOUR_FIELD = NoiseField("vigour", 90.0, 2)
TURBIDITY = NoiseField("turbidity", 350.0, 2)
HAZE = NoiseField("haze", 700.0, 1)
CROWN = NoiseField("crown", 6.0, 2)


# --- the world: thresholds and vector layers -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Layer:
    """Polygons with a surface and a DN tint each; `offset` places the tints in `World.tints`."""

    geoms: npt.NDArray[np.object_]
    surface: npt.NDArray[np.uint8]
    offset: int

    def burn(self, window: SceneWindow) -> npt.NDArray[np.int32]:
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
class World:
    seed: int
    thresholds: dict[str, float]
    parcels: Layer
    hedges: Layer
    waterways: Layer
    riparian: Layer
    parking: Layer
    buildings: Layer
    roads: Layer
    tints: F32  # (4, 1 + all tinted polygons); column 0 is no tint


@dataclass(frozen=True, slots=True)
class SceneWindow:
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


def build_world(seed: int, height_m: float, width_m: float) -> World:
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence([seed, crc("world")]).spawn(4)]
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
        (parking, np.full(len(parking), MAT["parking"]), 7.0),
        (buildings, roofs, 10.0),
        (road_polys, roads_surface, 5.0),
    ):
        offset = sum(len(t) for t in tints) - 1
        tints.append(_tints(rngs[3], len(geoms), sd))
        layers.append(Layer(np.asarray(geoms, dtype=object), surface.astype(np.uint8), offset))
    no_tint = np.zeros(0, dtype=np.uint8)
    return World(
        seed,
        thresholds,
        parcels,
        Layer(hedges, no_tint, 0),
        Layer(waterways, no_tint, 0),
        Layer(riparian, no_tint, 0),
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
    forest, lake = FOREST.on_grid(seed, x, y), LAKE.on_grid(seed, x, y)
    developed, barren = DEVELOPED.on_grid(seed, x, y), BARREN_PATCH.on_grid(seed, x, y)
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
) -> tuple[Layer, F32, npt.NDArray[np.object_]]:
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
    crop = rng.choice(len(CROPS), size=len(polys), p=CROP_SHARE)
    surface = np.array([MAT[c] for c in CROPS], dtype=np.uint8)[crop]
    rural = DEVELOPED.at(seed, pts[:, 0], pts[:, 1]) < t["developed"]
    hedged = (rng.random(len(polys)) < 0.35) & rural
    hedges = shapely.buffer(shapely.boundary(polys[hedged]), rng.uniform(2.0, 4.0, hedged.sum()))
    return Layer(polys, surface, 0), _tints(rng, len(polys), 7.0), hedges


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
    keep = DEVELOPED.at(seed, mid[:, 0], mid[:, 1]) > t["developed"]
    streets = shapely.linestrings(np.stack([starts[keep], ends[keep]], axis=1))
    lines.extend(streets)
    half_widths.extend(rng.uniform(3.0, 4.0, len(streets)))
    surface = np.where(rng.random(len(lines)) < 0.8, MAT["asphalt"], MAT["concrete"])
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

    level = DEVELOPED.at(seed, p[:, 0], p[:, 1])
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
    roofs = rng.choice([MAT[r] for r in ROOFS], size=len(p), p=(0.35, 0.35, 0.15, 0.15))

    in_lake = LAKE.at(seed, centre[:, 0], centre[:, 1]) > t["lake"] - 0.02
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
