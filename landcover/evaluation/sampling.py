"""A stratified random sample of a land-cover map, the strata being its classes (Olofsson et
al. 2014, section 5.1): how many points each class gets (`allocate`) and where they fall
(`draw_sample`).

The map (one COG, a VRT, a tiled product's `mosaic.vrt` or the change map of a `landcover
change` directory; or several maps of one class table that do not overlap) is read twice in
blocks of `SAMPLE_BLOCK_PX`, so memory does not grow with its size: the first pass counts each
class's pixels per block; then each class's sample is drawn as distinct pixel ranks among that
class's pixels (numpy's `Generator.choice` without replacement) and every rank is found in the
block that holds it on the second pass. The block size is fixed, so the same maps and seed
give the same points on any machine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio
from rasterio.windows import Window

from landcover.classes import unknown_codes
from landcover.errors import EvaluationError
from landcover.view.areas import CellAreas, cell_areas
from landcover.view.mapfile import MapFile, open_map
from tiling.runtime.urls import is_local
from tiling.sources.classes import NODATA_CODE, ClassMap

__all__ = [
    "DEFAULT_MIN_PER_CLASS",
    "SAMPLE_BLOCK_PX",
    "SampleConfig",
    "SamplePoints",
    "allocate",
    "count_map_classes",
    "draw_sample",
    "open_maps",
    "require_whole",
    "values_at",
    "window_pixel_m2",
]

logger = logging.getLogger(__name__)

SAMPLE_BLOCK_PX = 1024  # part of what a seed means: changing it moves the points
DEFAULT_MIN_PER_CLASS = 50  # Olofsson et al. 2014 suggest 50-100 points for a rare class
MIN_POINTS_PER_STRATUM = 2  # a stratum's variance divides by its points less one


@dataclass(frozen=True, slots=True)
class SampleConfig:
    """What `draw_sample` draws: `size` points in all (None: only `per_class`), at least
    `min_per_class` in each class (or all its pixels when it has fewer), `per_class` fixing
    the count of some classes by code, from the generator seeded with `seed`."""

    maps: tuple[str, ...]
    size: int | None = None
    min_per_class: int = DEFAULT_MIN_PER_CLASS
    per_class: Mapping[int, int] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.maps:
            raise EvaluationError("no map given; pass the land-cover map(s) to sample")
        if self.size is not None and self.size < 1:
            raise EvaluationError(f"--size {self.size}: must be a positive number of points")
        if self.size is None and not self.per_class:
            raise EvaluationError("give the sample's size: --size N or --per-class CODE=N")
        if self.min_per_class < 0:
            raise EvaluationError(f"--min-per-class {self.min_per_class}: must be 0 or more")
        for code, n in self.per_class.items():
            if n < 0:
                raise EvaluationError(f"--per-class {code}={n}: a count must be 0 or more")


@dataclass(frozen=True, slots=True)
class SamplePoints:
    """The drawn points (pixel centres in the maps' CRS) and the strata they represent.
    Arrays are indexed by point; `mapped_pixels` and `sample_sizes` by class code."""

    x: npt.NDArray[np.float64]
    y: npt.NDArray[np.float64]
    map_code: npt.NDArray[np.int64]
    crs_wkt: str
    class_map: ClassMap
    mapped_pixels: npt.NDArray[np.int64]
    sample_sizes: npt.NDArray[np.int64]
    maps: tuple[str, ...]
    seed: int

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """Each class's share of the mapped pixels (the stratum weight W_h), by code."""
        return self.mapped_pixels / max(int(self.mapped_pixels.sum()), 1)


def open_maps(paths: Sequence[str]) -> list[MapFile]:
    """The maps at `paths`, refused in one line when they cannot be one population: class
    tables, CRSs or pixel sizes that differ, or maps that overlap (a pixel counted twice)."""
    maps = [require_whole(open_map(_change_map_of(p))) for p in paths]
    first = maps[0]
    for other in maps[1:]:
        if other.class_map.class_names != first.class_map.class_names:
            raise EvaluationError(
                f"{other.given} has the class table {other.class_map.name!r} "
                f"({', '.join(other.class_map.class_names[1:])}) and {first.given} "
                f"{first.class_map.name!r} ({', '.join(first.class_map.class_names[1:])}); "
                "sample maps of one class table"
            )
        if other.crs != first.crs:
            raise EvaluationError(
                f"{other.given} is in {other.crs} and {first.given} in {first.crs}; warp them "
                "onto one CRS (or sample them apart)"
            )
        if (other.transform.a, other.transform.e) != (first.transform.a, first.transform.e):
            raise EvaluationError(
                f"{other.given} has {other.transform.a} x {-other.transform.e} pixels and "
                f"{first.given} {first.transform.a} x {-first.transform.e}; sample maps of "
                "one pixel size"
            )
    for i, a in enumerate(maps):
        for b in maps[i + 1 :]:
            if _overlap(a.bounds, b.bounds):
                raise EvaluationError(
                    f"{a.given} and {b.given} overlap, so their shared pixels would count "
                    "twice; give maps that tile the region (or a tiled product)"
                )
    return maps


def _change_map_of(given: str) -> str:
    """The change map of a `landcover change` output directory, else `given` as it is."""
    from landcover.change.transitions import read_change_record

    record = read_change_record(given) if is_local(given) and Path(given).is_dir() else None
    return given if record is None else str(Path(given) / record.map_name)


def require_whole(m: MapFile) -> MapFile:
    """`m`, refused when tiles of its product are missing: its class areas (the strata, the
    change) would leave them out unsaid."""
    if m.missing:
        names = ", ".join(m.missing[:3]) + (" ..." if len(m.missing) > 3 else "")
        raise EvaluationError(
            f"{m.given}: {len(m.missing)} tile(s) of the product are missing ({names}); "
            "restore them (or predict them again) so that every pixel of the map counts"
        )
    return m


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _blocks(m: MapFile) -> list[Window]:
    return [
        Window(col, row, min(SAMPLE_BLOCK_PX, m.width - col), min(SAMPLE_BLOCK_PX, m.height - row))
        for row in range(0, m.height, SAMPLE_BLOCK_PX)
        for col in range(0, m.width, SAMPLE_BLOCK_PX)
    ]


def _read_codes(ds: rasterio.DatasetReader, window: Window, m: MapFile) -> npt.NDArray[np.uint8]:
    codes: npt.NDArray[np.uint8] = ds.read(1, window=window)
    unknown = unknown_codes(codes, m.class_map)
    if unknown is not None:
        raise EvaluationError(
            f"{m.given}: {unknown}; sample a map written by `landcover predict` or "
            "`landcover change`"
        )
    return codes


def count_map_classes(
    maps: Sequence[MapFile], *, area_m2: npt.NDArray[np.float64] | None = None
) -> npt.NDArray[np.int64]:
    """Pixels of each class code (0 = nodata included) per block, in the order the maps and
    their blocks are read: an array (blocks, K). With `area_m2` (K,), each code's area on the
    ellipsoid (`landcover.view.areas.cell_areas`) is added to it in the same pass."""
    k = maps[0].class_map.num_classes
    rows = []
    for m in maps:
        cells = cell_areas(m) if area_m2 is not None else None
        with rasterio.open(m.path) as ds:
            for window in _blocks(m):
                codes = _read_codes(ds, window, m)
                rows.append(np.bincount(codes.ravel(), minlength=k)[:k].astype(np.int64))
                if area_m2 is not None and cells is not None:
                    weights = window_pixel_m2(cells, window).ravel()
                    area_m2 += np.bincount(codes.ravel(), weights=weights, minlength=k)[:k]
    return np.stack(rows) if rows else np.zeros((0, k), dtype=np.int64)


def values_at(
    ds: rasterio.DatasetReader, rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Band 1 of `ds` at the pixels (`rows`, `cols`), all inside it: each block of the file
    that holds a point is read once, whatever the number of points in it (a point at a time
    decodes a block per point)."""
    values = np.zeros(len(rows), dtype=np.int64)
    if not len(rows):
        return values
    bh, bw = (max(int(v), 1) for v in ds.block_shapes[0])
    block = (rows // bh) * ((ds.width + bw - 1) // bw) + cols // bw
    order = np.argsort(block, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(block[order]) != 0])
    for group in np.split(order, starts[1:]):
        r0, c0 = int(rows[group[0]] // bh) * bh, int(cols[group[0]] // bw) * bw
        window = Window(c0, r0, min(bw, ds.width - c0), min(bh, ds.height - r0))
        data = ds.read(1, window=window)
        values[group] = data[rows[group] - r0, cols[group] - c0]
    return values


def window_pixel_m2(cells: CellAreas, window: Window) -> npt.NDArray[np.float64]:
    """The area in m² on the ellipsoid of each pixel of `window` (rows x columns), from the
    map's `cell_areas`: the one measure of a pixel's area that view, change and evaluate
    share (a geographic or Web Mercator pixel is not its nominal size)."""
    rows = np.arange(int(window.row_off), int(window.row_off + window.height)) // cells.rows
    cols = np.arange(int(window.col_off), int(window.col_off + window.width)) // cells.cols
    return cells.pixel_m2[np.ix_(rows, cols)]


def allocate(
    mapped_pixels: npt.NDArray[np.int64],
    *,
    size: int | None,
    min_per_class: int,
    per_class: Mapping[int, int],
    class_map: ClassMap,
) -> npt.NDArray[np.int64]:
    """Points per class code (0 = nodata gets none): the classes named in `per_class` get
    their count; the other classes share what is left of `size` in proportion to their
    mapped area, each at least `min_per_class` (the allocation Olofsson et al. 2014 advise:
    proportional, with rare classes raised to a floor), and never more than its pixels.
    Refuses (one line) an allocation that leaves a class of the map with fewer than two
    points: an empty stratum, whose variance the estimates cannot have."""
    k = class_map.num_classes
    counts = np.zeros(k, dtype=np.int64)
    for code, n in per_class.items():
        if not 1 <= code < k:
            raise EvaluationError(
                f"--per-class {code}={n}: no class {code} in the map's table "
                f"{class_map.name!r}; choose from "
                + ", ".join(f"{c.code} ({c.name})" for c in class_map.classes[1:])
            )
        if n > 0 and mapped_pixels[code] == 0:
            raise EvaluationError(
                f"--per-class {code}={n}: class {code} ({class_map.classes[code].name}) has no "
                "pixel in the map, so its stratum is empty; drop it"
            )
        counts[code] = min(n, int(mapped_pixels[code]))
    if size is not None and int(counts.sum()) > size:
        raise EvaluationError(
            f"--per-class asks for {int(counts.sum())} points, more than --size {size}; raise "
            "--size or drop it"
        )
    rest = [c for c in range(1, k) if c not in per_class and mapped_pixels[c] > 0]
    if size is not None and rest:
        _share(counts, mapped_pixels, rest, size=size, min_per_class=min_per_class)
    for c in range(1, k):
        if counts[c] < min(MIN_POINTS_PER_STRATUM, int(mapped_pixels[c])):
            raise EvaluationError(
                f"class {c} ({class_map.classes[c].name}) has {int(mapped_pixels[c]):,} pixels "
                f"but would get {int(counts[c])} point(s): its stratum needs at least "
                f"{MIN_POINTS_PER_STRATUM} for the estimates; give it --per-class {c}=N or "
                "--size"
            )
    return counts


def _share(
    counts: npt.NDArray[np.int64],
    mapped_pixels: npt.NDArray[np.int64],
    rest: list[int],
    *,
    size: int,
    min_per_class: int,
) -> None:
    """Share what `size` leaves after `counts` among the classes `rest` (see `allocate`)."""
    left = size - int(counts.sum())
    floors = {c: min(min_per_class, int(mapped_pixels[c])) for c in rest}
    if left < sum(floors.values()):
        raise EvaluationError(
            f"--size {size} leaves {max(left, 0)} points for {len(rest)} classes, fewer than "
            f"--min-per-class {min_per_class} each; raise --size or lower --min-per-class"
        )
    # proportional shares; classes under their floor are fixed at it and the rest re-shared
    fixed: dict[int, int] = {}
    while True:
        free = [c for c in rest if c not in fixed]
        budget = left - sum(fixed.values())
        area = float(sum(int(mapped_pixels[c]) for c in free))
        share = {c: budget * int(mapped_pixels[c]) / area for c in free}
        under = [c for c in free if share[c] < floors[c] or share[c] > mapped_pixels[c]]
        if not under:
            break
        for c in under:
            fixed[c] = floors[c] if share[c] < floors[c] else int(mapped_pixels[c])
        if len(fixed) == len(rest):
            break
    free = [c for c in rest if c not in fixed]
    budget = left - sum(fixed.values())
    for c, n in fixed.items():
        counts[c] = n
    if free:
        # largest remainders, so the counts add up to `size` exactly
        area = float(sum(int(mapped_pixels[c]) for c in free))
        exact = np.array([budget * int(mapped_pixels[c]) / area for c in free])
        whole = np.floor(exact).astype(np.int64)
        order = np.argsort(-(exact - whole), kind="stable")
        whole[order[: budget - int(whole.sum())]] += 1
        for c, n in zip(free, whole, strict=True):
            counts[c] = min(int(n), int(mapped_pixels[c]))


def draw_sample(config: SampleConfig) -> SamplePoints:
    """The stratified random sample of `config.maps` (see the module docstring)."""
    maps = open_maps(config.maps)
    class_map = maps[0].class_map
    with rasterio.Env(GDAL_CACHEMAX=64 * 1024 * 1024):
        per_block = count_map_classes(maps)
        mapped = per_block.sum(axis=0)
        mapped[NODATA_CODE] = 0
        if int(mapped.sum()) == 0:
            raise EvaluationError(
                f"{', '.join(config.maps)}: no classified pixel (all nodata); nothing to sample"
            )
        sizes = allocate(
            mapped,
            size=config.size,
            min_per_class=config.min_per_class,
            per_class=config.per_class,
            class_map=class_map,
        )
        rng = np.random.default_rng(config.seed)
        wanted = _ranks_per_block(per_block, sizes, rng)
        x, y, code = _locate(maps, wanted)
    logger.info("drew %d points over %d classes", len(x), int((sizes > 0).sum()))
    return SamplePoints(
        x=x,
        y=y,
        map_code=code,
        crs_wkt=maps[0].crs.to_wkt(),
        class_map=class_map,
        mapped_pixels=mapped,
        sample_sizes=sizes,
        maps=tuple(config.maps),
        seed=config.seed,
    )


def _ranks_per_block(
    per_block: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], rng: np.random.Generator
) -> dict[int, list[tuple[int, npt.NDArray[np.int64]]]]:
    """For each block that holds a point: (class code, ranks of the points among that
    block's pixels of the class, in reading order)."""
    wanted: dict[int, list[tuple[int, npt.NDArray[np.int64]]]] = {}
    for code in range(1, per_block.shape[1]):
        n = int(sizes[code])
        if n == 0:
            continue
        in_blocks = per_block[:, code]
        ends = np.cumsum(in_blocks)
        ranks = np.sort(rng.choice(int(ends[-1]), size=n, replace=False))
        block_of = np.searchsorted(ends, ranks, side="right")
        starts = ends - in_blocks
        for b in np.unique(block_of):
            local = ranks[block_of == b] - starts[b]
            wanted.setdefault(int(b), []).append((code, local.astype(np.int64)))
    return wanted


def _locate(
    maps: Sequence[MapFile], wanted: Mapping[int, list[tuple[int, npt.NDArray[np.int64]]]]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The pixel centres of the wanted ranks, read block by block (second pass)."""
    xs: list[npt.NDArray[np.float64]] = []
    ys: list[npt.NDArray[np.float64]] = []
    codes: list[npt.NDArray[np.int64]] = []
    index = 0
    for m in maps:
        blocks = _blocks(m)
        todo = [(index + i, w) for i, w in enumerate(blocks) if index + i in wanted]
        index += len(blocks)
        if not todo:
            continue
        t = m.transform
        with rasterio.open(m.path) as ds:
            for b, window in todo:
                block = _read_codes(ds, window, m).ravel()
                for code, local in wanted[b]:
                    flat = np.flatnonzero(block == code)[local]
                    rows = window.row_off + flat // int(window.width)
                    cols = window.col_off + flat % int(window.width)
                    xs.append(t.c + (cols + 0.5) * t.a)
                    ys.append(t.f + (rows + 0.5) * t.e)
                    codes.append(np.full(flat.shape, code, dtype=np.int64))
    if not xs:
        empty = np.zeros(0)
        return empty, empty, np.zeros(0, dtype=np.int64)
    x, y, by_point = np.concatenate(xs), np.concatenate(ys), np.concatenate(codes)
    order = np.lexsort((x, -y, by_point))  # by class, then north to south, west to east
    return x[order], y[order], by_point[order]
