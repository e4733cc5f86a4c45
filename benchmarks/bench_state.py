"""State counts on this machine: the cost per source of `landcover tile` against the count.

A whole state is thousands of sources (Virginia: ~4,000 NAIP quarter-quads in UTM 17N and
18N, labels in CONUS Albers). Pixels are not what this measures, so every source is a small
VRT over one file (`statemosaic.build_state_mosaic`): images in UTM 18N, 1 m label tiles in
EPSG:5070. For each count N it runs, in a fresh process each:

- plan: `tiling.tiler.plan.plan_tiling` alone (inputs opened, labels matched, split decided);
- tile: `tiling.tiler.tile.tile`, one worker, the whole run (plan, cut, commit);

and prints seconds, milliseconds per source, and the ratio of the per-source cost to that
at the smallest N (1.0 = linear in N; a cost that grows with N shows as a ratio above 1).
Then the footprint-planning count alone (`--footprints`, default 40,000): the label index
built and every image matched, no files opened; and the plan file at that count
(`tiling.tiler.planfile`: its bytes, rank 0's write and another rank's load).

Then the end-to-end state-count run (`--end-to-end`, `staterun.py`): for each count, tile and
then tiled predict (`predict --out DIR/ --tile-size`), each as `--ranks` processes started as
an engine starts them, printing per-unit costs against N and each rank's peak RSS; one more
run at the smallest count with `--pixel-px` sources separates the per-unit cost from the
per-pixel cost, and the two give the estimate for 4,000 quarter-quads on 16 and 64 nodes.
Every table is also written to `--json` (benchmarks/results/state.json).

`--from-peers PEERS_JSON` instead turns the km²/min of our defaults that `bench_peers.py`
measured (its `summary` table, one process on this machine's cores) into hours for a state's
STATE_KM2 (Virginia: ~110,000 km²) on 1, 16 and 64 nodes of NODE_CORES cores, assuming
prediction's rate grows with the cores (one rank per `--nproc` share, as `bench_predict_ranks.py`
measures) and no time for reading images from blob storage or assembling a COG; it runs in
seconds and writes benchmarks/results/state_hours.json.

Usage: python benchmarks/bench_state.py [--counts 160,1600] [--footprints 40000]
       [--end-to-end 100,400] [--ranks 2] [--pixel-px 512] [--no-predict]
       python benchmarks/bench_state.py --from-peers benchmarks/results/peers.json
Never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from resultfile import (  # noqa: E402
    Cell,
    ResultFile,
    ResultTable,
    read_result_file,
    this_machine,
    today,
    write_result_file,
)

STATE_KM2 = 110_000  # Virginia, ~110,000 km²: the state the estimates are for
NODE_CORES = 16  # cores of a node in the estimates (staterun.RANKS_PER_NODE ranks of one core)
NODE_COUNTS = (1, 16, 64)


def _child(kind: str, n: int) -> None:
    """Runs in its own process: build the mosaic, time one stage, print JSON."""
    import resource
    import warnings

    sys.path.insert(0, str(HERE))
    from statemosaic import build_state_mosaic

    from tiling.tiler.config import TileConfig
    from tiling.tiler.plan import plan_tiling
    from tiling.tiler.tile import tile

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix="bench_state_") as tmp:
        mosaic = build_state_mosaic(Path(tmp), n)
        config = TileConfig(
            images=tuple(str(p) for p in mosaic.images),
            labels=tuple(str(p) for p in mosaic.labels),
            out=str(Path(tmp) / "chips.zarr"),
            chip_size=64,
            min_valid=0.0,
            workers=1,
        )
        start = time.perf_counter()
        if kind == "plan":
            plan_tiling(config)
        else:
            tile(config)
        seconds = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"n": n, "labels": len(mosaic.labels), "s": seconds, "rss": rss}))


def _footprints(n: int) -> tuple[float, int, int]:
    """Seconds to index the label tiles and match `n` image footprints, and the matches."""
    from affine import Affine
    from rasterio.crs import CRS
    from rasterio.warp import transform_bounds

    from tiling.sources.labels import LabelIndex
    from tiling.sources.rasters import RasterInfo

    utm, albers = CRS.from_epsg(26918), CRS.from_epsg(5070)
    side = int(n**0.5) + 1

    def info(path: str, crs: CRS, x: float, y: float, size: int, count: int) -> RasterInfo:
        return RasterInfo(
            path=path, crs=crs, transform=Affine(1, 0, x, 0, -1, y), width=size, height=size,
            count=count, dtype="uint8", nodata=None, block_shape=(256, 256), mask_kind="none",
        )  # fmt: skip

    images = [
        info(f"i{k}", utm, 300_000 + (k % side) * 248, 4_400_000 - (k // side) * 248, 256, 4)
        for k in range(n)
    ]
    extent = (300_000, 4_400_000 - side * 248, 300_000 + side * 248 + 256, 4_400_000)
    left, bottom, right, top = transform_bounds(utm, albers, *extent)
    tile_m = 2048
    labels = [
        info(f"l{j}-{i}", albers, left + i * tile_m, top - j * tile_m, tile_m, 1)
        for j in range(int((top - bottom) // tile_m) + 1)
        for i in range(int((right - left) // tile_m) + 1)
    ]
    start = time.perf_counter()
    index = LabelIndex(labels)
    matched = sum(len(index.match(image)) for image in images)
    return time.perf_counter() - start, matched, len(labels)


def _plan_file(n: int) -> tuple[int, float, float]:
    """Bytes of the plan file of `n` footprint-only sources, and seconds to write it (rank 0)
    and to load it (another rank)."""
    import numpy as np
    from affine import Affine
    from rasterio.crs import CRS
    from rasterio.warp import transform_bounds

    from tiling.chipstore.split import chip_blocks, choose_split
    from tiling.sources.grid import chip_grid
    from tiling.sources.labels import LabelIndex
    from tiling.sources.rasters import RasterInfo
    from tiling.tiler.config import TileConfig
    from tiling.tiler.plan import PlacedImage, assemble_plan, class_map_of
    from tiling.tiler.planfile import plan_from_json, plan_to_json
    from tiling.tiler.staging import PartStaging

    utm, albers = CRS.from_epsg(26918), CRS.from_epsg(5070)
    side = int(n**0.5) + 1

    def info(path: str, crs: CRS, x: float, y: float, size: int, count: int) -> RasterInfo:
        return RasterInfo(
            path=path, crs=crs, transform=Affine(1, 0, x, 0, -1, y), width=size, height=size,
            count=count, dtype="uint8", nodata=None, block_shape=(256, 256), mask_kind="zero",
        )  # fmt: skip

    images = [
        info(f"i{k}", utm, 300_000 + (k % side) * 248, 4_400_000 - (k // side) * 248, 256, 4)
        for k in range(n)
    ]
    extent = (300_000, 4_400_000 - side * 248, 300_000 + side * 248 + 256, 4_400_000)
    left, bottom, right, top = transform_bounds(utm, albers, *extent)
    edge = int(max(right - left, top - bottom)) + 2
    labels = [info("l", albers, left - 1, top + 1, edge, 1)]  # one label raster over them all
    config = TileConfig(images=("i*",), labels=("l",), out="s.zarr", chip_size=64)
    index = LabelIndex(labels)
    placed = []
    for image in images:
        grid = chip_grid(256, 256, 64, 64, where=image.path)
        placed.append(PlacedImage(image, grid, index.match(image), chip_blocks(image, grid, 256.0)))
    rule = choose_split(np.concatenate([p.blocks.reshape(-1, 2) for p in placed]),
                        val_fraction=0.1, edge_m=256.0)  # fmt: skip
    paths = tuple(i.path for i in images)
    plan = assemble_plan(config, class_map=class_map_of(config), images=paths, labels=("l",),
                         placed=placed, split=rule, skipped=())  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as tmp:
        staging = PartStaging(str(Path(tmp) / "s.zarr"))
        start = time.perf_counter()
        body = plan_to_json(plan, "k" * 24)
        staging.put_plan("k" * 24, body)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        read = staging.get_plan("k" * 24)
        assert read is not None
        plan_from_json(config, read, key="k" * 24, images=plan.params.images, labels=("l",))
        load_s = time.perf_counter() - start
    return len(body), write_s, load_s


def _print_table(columns: list[str], rows: list[list[Cell]]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if k == 0 else "---:" for k in range(len(columns))) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def hours_from_peers(peers_json: str) -> ResultTable:
    """Hours to predict STATE_KM2 on 1, 16 and 64 nodes of NODE_CORES cores, for each model,
    from the km²/min of our defaults in `peers_json`'s `summary` table (measured on this
    machine's cores by bench_peers.py), taken to grow in proportion to the cores."""
    peers = read_result_file(peers_json)
    summary = peers.table("summary")
    col = {name: k for k, name in enumerate(summary.columns)}
    cores = re.search(r"(\d+) cores", peers.machine)  # the machine the rates are from
    cores_here = int(cores.group(1)) if cores else (os.cpu_count() or 1)
    rows: list[list[Cell]] = []
    for row in summary.rows:
        rate = row[col["ours km²/min"]]
        if not isinstance(rate, int | float):
            rows.append([row[0], None, None, *[None] * len(NODE_COUNTS)])
            continue
        per_core = rate / cores_here
        here_h = STATE_KM2 / rate / 60
        rows.append(
            [row[0], rate, round(here_h, 1)]
            + [round(STATE_KM2 / (per_core * NODE_CORES * n) / 60, 2) for n in NODE_COUNTS]
        )
    return ResultTable(
        "hours",
        f"Predicting a state ({STATE_KM2:,} km² at 1 m) at our defaults' measured rate",
        ["model", f"km²/min on {cores_here} cores (bench_peers)", f"h on {cores_here} cores"]
        + [f"h on {n} node{'s' if n > 1 else ''} ({n * NODE_CORES} cores)" for n in NODE_COUNTS],
        rows,
        note=(
            f"from {Path(peers_json).name} of {peers.date} ({peers.machine}); the rate taken "
            f"to grow with the cores, {NODE_CORES} a node; reading the images from storage "
            "and assembling one COG not counted"
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", default="160,1600")
    parser.add_argument("--footprints", type=int, default=40_000)
    parser.add_argument("--end-to-end", default="100,400", help="counts; '' skips it")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pixel-px", type=int, default=512)
    parser.add_argument("--no-predict", action="store_true")
    parser.add_argument("--json", default=str(HERE / "results" / "state.json"))
    parser.add_argument(
        "--from-peers",
        default=None,
        metavar="PEERS_JSON",
        help="only the state's prediction hours from bench_peers.py's measured km²/min",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    if args.from_peers:
        _from_peers(args.from_peers, args.json)
        return
    counts = sorted(int(c) for c in args.counts.split(",") if c)
    load_before = os.getloadavg()[0]
    print(f"# bench_state — {os.cpu_count()} cores; load {load_before:.2f}")
    print("sources: 256 px VRTs in UTM 18N; labels: 2048 px VRT tiles in EPSG:5070; 64 px chips")
    print()
    tables: list[ResultTable] = []
    columns = ["stage", "N sources", "label tiles", "s", "ms/source", "ratio to smallest N",
               "peak RSS MiB"]  # fmt: skip
    rows: list[list[Cell]] = []
    plan_s_per_source = 0.0
    for kind in ("plan", "tile"):
        base = None
        for n in counts:
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(n)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                rows.append([kind, n, f"failed: {done.stderr.strip().splitlines()[-1]}"])
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            per = 1e3 * row["s"] / n
            base = base or per
            if kind == "plan":
                plan_s_per_source = per / 1e3
            rows.append([kind, n, row["labels"], round(row["s"], 1), round(per, 1),
                         round(per / base, 2), round(row["rss"] / 2**20)])  # fmt: skip
    _print_table(columns, rows)
    tables.append(ResultTable("planning", "Planning and tiling at state counts", columns, rows))
    if args.footprints:
        seconds, matched, tiles = _footprints(args.footprints)
        print()
        print(
            f"footprints: {args.footprints} images matched against {tiles} label tiles "
            f"({matched} matches) in {seconds:.1f} s ({1e6 * seconds / args.footprints:.0f} "
            "µs per image)"
        )
        size, write_s, load_s = _plan_file(args.footprints)
        print(
            f"plan file of {args.footprints} sources: {size / 2**20:.1f} MiB, written in "
            f"{write_s:.1f} s (rank 0), loaded in {load_s:.1f} s (any other rank)"
        )
        tables.append(ResultTable(
            "footprints", "Footprints and the plan file at state counts",
            ["sources", "label tiles", "match s", "plan file MiB", "write s", "load s"],
            [[args.footprints, tiles, round(seconds, 1), round(size / 2**20, 1),
              round(write_s, 1), round(load_s, 1)]],
        ))  # fmt: skip
    e2e = sorted(int(c) for c in args.end_to_end.split(",") if c)
    if e2e:
        tables.extend(_end_to_end(e2e, args.ranks, args.pixel_px, not args.no_predict,
                                  plan_s_per_source))  # fmt: skip
    load_after = os.getloadavg()[0]
    print(f"load after: {load_after:.2f}")
    command = "python benchmarks/bench_state.py " + " ".join(sys.argv[1:])
    write_result_file(args.json, ResultFile(
        benchmark="bench_state.py", command=command.strip(), machine=this_machine(),
        date=today(), tables=tables,
        conditions=f"load average {load_before:.1f} before, {load_after:.1f} after",
    ))  # fmt: skip
    print(f"wrote {args.json}")


def _from_peers(peers_json: str, json_path: str) -> None:
    """The `--from-peers` run: print the hours table and write it (state.json, the end-to-end
    run's file, is never overwritten by it: state_hours.json instead)."""
    table = hours_from_peers(peers_json)
    print(f"## {table.title}")
    print()
    _print_table(table.columns, table.rows)
    print()
    print(table.note)
    if Path(json_path).name == "state.json":
        json_path = str(Path(json_path).with_name("state_hours.json"))
    command = "python benchmarks/bench_state.py " + " ".join(sys.argv[1:])
    write_result_file(json_path, ResultFile(
        benchmark="bench_state.py", command=command.strip(), machine=this_machine(),
        date=today(), tables=[table],
        conditions=f"rates of {peers_json}, measured by bench_peers.py; no run here",
    ))  # fmt: skip
    print(f"wrote {json_path}")


def _end_to_end(
    counts: list[int], ranks: int, pixel_px: int, predict: bool, plan_s_per_source: float
) -> list[ResultTable]:
    """Tile and tiled predict as ranks at each count; the state estimate from the rates."""
    from staterun import (
        QUARTER_QUAD_PX,
        RANKS_PER_NODE,
        STATE_SOURCES,
        TILE_PX,
        end_to_end,
        estimate,
        fit_unit_cost,
    )

    columns = ["stage", "N sources", "source px", "ranks", "wall s", "units",
               "rank-ms per unit", "ratio to smallest N", "peak RSS per rank MiB"]  # fmt: skip
    rows: list[list[Cell]] = []
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_state_e2e_") as tmp:
        sizes = [(n, 256) for n in counts] + [(counts[0], pixel_px)]
        for n, size in sizes:
            runs.extend(end_to_end(Path(tmp), n, ranks, size_px=size, predict=predict))
    base: dict[str, float] = {}
    for run in runs:
        size = round((run.pixels / run.n_sources) ** 0.5)
        if run.error:
            rows.append([run.stage, run.n_sources, size, ranks, "failed: " + run.error])
            continue
        per = 1e3 * run.rank_s_per_unit
        if size == 256:
            base.setdefault(run.stage, per)
        ratio = round(per / base[run.stage], 2) if size == 256 else ""
        rss = "/".join(str(round(r / 2**20)) for r in run.rss_bytes)
        rows.append([run.stage, run.n_sources, size, ranks, round(run.wall_s, 1), run.units,
                     round(per, 1), ratio, rss])  # fmt: skip
    print()
    print(f"end to end, {ranks} ranks (units: sources for tile, {TILE_PX} px tiles for predict)")
    _print_table(columns, rows)
    tables = [ResultTable("end_to_end", "Tile and tiled predict at state counts, as ranks",
                          columns, rows)]  # fmt: skip
    ok = {(r.stage, r.n_sources, round((r.pixels / r.n_sources) ** 0.5)): r
          for r in runs if not r.error}  # fmt: skip
    pair = [(ok.get((s, counts[0], 256)), ok.get((s, counts[0], pixel_px)))
            for s in ("tile", "predict")]  # fmt: skip
    if any(a is None or b is None for a, b in pair):
        return tables
    tile_cost = fit_unit_cost(*pair[0])  # type: ignore[arg-type]
    predict_cost = fit_unit_cost(*pair[1])  # type: ignore[arg-type]
    print()
    print(
        f"model: rank-seconds = a x units + b x pixels (fitted at N = {counts[0]}, "
        f"{256} and {pixel_px} px): tile a = {1e3 * tile_cost[0]:.1f} ms/source, "
        f"b = {1e9 * tile_cost[1]:.1f} s/Gpx; predict a = {1e3 * predict_cost[0]:.1f} ms/tile, "
        f"b = {1e9 * predict_cost[1]:.1f} s/Gpx"
    )
    print(
        f"state: {STATE_SOURCES} quarter-quads of {QUARTER_QUAD_PX / 1e6:.0f} Mpx, "
        f"{RANKS_PER_NODE} ranks a node; time = (a x units + b x pixels) / ranks + rank 0's "
        f"planning ({1e3 * plan_s_per_source:.1f} ms/source)"
    )
    est_rows: list[list[Cell]] = []
    for nodes in (16, 64):
        e = estimate(tile_cost, predict_cost, plan_s_per_source, nodes)
        est_rows.append([nodes, nodes * RANKS_PER_NODE, round(e["tile_h"], 2),
                         round(e["predict_h"], 2), int(e["tiles"])])  # fmt: skip
    est_columns = ["nodes", "ranks", "tile h", "predict h", f"{TILE_PX} px tiles"]
    _print_table(est_columns, est_rows)
    tables.append(ResultTable("estimate", "A state from the measured rates", est_columns,
                              est_rows))  # fmt: skip
    return tables


if __name__ == "__main__":
    main()
