"""Tiling throughput: the whole `landcover tile` process side by side with the machine's limit.

Three NAIP-sized synthetic scenes (6,000 x 7,500 px x 4 bands uint8, a quarter quad, with
their 1 m labels; `--quick`: 2,048 x 2,048; `--scenes`, `--size` to change) are written once
by `tiling.synthetic.scenes` (kept with `--scenes-dir` for later runs), then:

- ours: `python -m landcover tile SCENES --labels ... --workers 1 --min-valid 0` (every chip
  kept: the same pixels as the limit), timed as a whole process, imports included;
- the limit: a process that imports rasterio and numcodecs, reads the same image and label
  files with rasterio in 256-row strips, zstd-encodes each strip (the store's codec and level)
  and writes the bytes to one file per raster, fsynced. Nothing else: no chips, no store, no
  index, no statistics.
- the limit for chips: the same process, but zstd-encoding the 256 px chips the store keeps
  (the grid's offsets, the last chip of a row or column moved back inside the raster) instead
  of strips, one frame a chip, with the parameters the store's encoder uses
  (`tiling.chipstore.shards.chunk_compression_parameters`: the level's parameters for a large
  input, through the `zstandard` package; zstd by itself would pick costlier ones for an
  input of 256 KiB or less, which a 256 x 256 x 4 chip is). This is the limit for writing
  the store's chunks, and ours against it is what the rest of tiling costs.

The three alternate, `--repeat` times each after one untimed warm-up run of both (bytecode
compiled, files in the page cache), and the table gives medians, wall and CPU (user + system
of the child process): other load on the machine moves wall time a lot and CPU time little.
The goal is ours >= 0.8x of the (strip) limit's throughput (limit seconds / ours).

Then, in this process: where ours' time goes (the parts of `tile` timed), and with
`--workers-table` every method at `--workers` (ours, the limit in-process: whole-scene reads
and zstd of every chip at the store encoder's parameters, and the original Azure tutorial's
one GeoTIFF per chip). Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.windows
import zstandard

import tiling.tiler.append
import tiling.tiler.cut
import tiling.tiler.planfile
import tiling.tiler.rankplan
from tiling.chipstore.shards import ChunkEncoder, chunk_compression_parameters
from tiling.chipstore.writer import ChipStoreWriter
from tiling.runtime.machine import local_cpu_count
from tiling.sources.grid import chip_offsets
from tiling.sources.reader import RasterReader
from tiling.synthetic.scenes import SynthConfig, scene_folders, synthesize_scenes
from tiling.tiler.config import COMPRESSION_LEVEL
from tiling.tiler.tile import TileConfig, tile

CHIP = 256
NAIP_SIZE = (7500, 6000)  # rows x columns of a NAIP quarter quad
QUICK_SIZE = (2048, 2048)
STRIP_ROWS = 256  # the limit encodes 256-row strips
ZSTD_LEVEL = COMPRESSION_LEVEL  # what `landcover tile` uses
ONE_WORKER_GOAL = 0.8  # of the limit's throughput, issue 43

# The limit, as its own process: read every raster in strips, zstd them, write, fsync.
LIMIT_SCRIPT = """
import os, sys
import rasterio
from numcodecs import Zstd
from rasterio.windows import Window

out, level, strip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
zstd = Zstd(level=level)
for k, path in enumerate(sys.argv[4:]):
    with rasterio.open(path) as ds, open(os.path.join(out, f"{k}.zst"), "wb") as f:
        for row in range(0, ds.height, strip):
            window = Window(0, row, ds.width, min(strip, ds.height - row))
            f.write(zstd.encode(ds.read(window=window)))
        f.flush()
        os.fsync(f.fileno())
"""

# The limit for the store's chunks: the same, but each strip is cut into the store's 256 px
# chips (at the grid's offsets) and each chip is one zstd frame, made with the parameters of
# the store's encoder (passed as JSON: the child imports nothing of ours).
LIMIT_CHIPS_SCRIPT = """
import json, os, sys
import numpy as np
import rasterio
import zstandard
from rasterio.windows import Window

out, params, chip = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
compressor = zstandard.ZstdCompressor(
    compression_params=zstandard.ZstdCompressionParameters(**params)
)

def offsets(length):
    starts = list(range(0, length - chip + 1, chip))
    if starts[-1] + chip < length:
        starts.append(length - chip)
    return starts

for k, path in enumerate(sys.argv[4:]):
    with rasterio.open(path) as ds, open(os.path.join(out, f"{k}.zst"), "wb") as f:
        cols = offsets(ds.width)
        for row in offsets(ds.height):
            strip = ds.read(window=Window(0, row, ds.width, chip))
            for col in cols:
                f.write(compressor.compress(np.ascontiguousarray(strip[:, :, col : col + chip])))
        f.flush()
        os.fsync(f.fileno())
"""

# The parts of `tile` timed for the breakdown: (label, owner, attribute). Indented labels are
# parts of the one above them.
TIMED_PARTS: tuple[tuple[str, Any, str], ...] = (
    ("plan: inputs checked, chip grid, split", tiling.tiler.planfile, "plan_tiling"),
    ("fingerprints of the inputs", tiling.tiler.rankplan, "fingerprints"),
    ("open the store", tiling.tiler.append, "open_writer"),
    ("reader threads: windows read and prepared", tiling.tiler.cut, "_prepare_window"),
    ("  read image: GDAL + valid mask", RasterReader, "read_image"),
    ("  read labels: GDAL + class map", RasterReader, "read_labels"),
    ("cutting threads: chips copied out, counted, compressed", tiling.tiler.cut, "_cut_window"),
    ("  compress chips: zstd + crc32c", ChunkEncoder, "encode"),
    ("writer: shard objects assembled + written", ChipStoreWriter, "_flush"),
    ("writer: group attributes", ChipStoreWriter, "write_attrs"),
)


@dataclass(frozen=True)
class Scenes:
    images: list[Path]
    labels: list[Path]
    height: int
    width: int


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    cpu_seconds: float  # user + system of this process's threads and its child processes
    chips: int
    raw_bytes: int

    @property
    def chips_per_s(self) -> float:
        return self.chips / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.raw_bytes / self.seconds / 1e6


# --- scenes --------------------------------------------------------------------------------


def make_scenes(folder: Path, count: int, height: int, width: int) -> Scenes:
    """`count` synthetic scenes of height x width px and their labels in `folder` (reused when
    there already): synthesized square, then cut to size when height != width."""
    naip, labels = scene_folders(folder)
    images = sorted(naip.glob("*.tif"))
    if len(images) != count:
        shutil.rmtree(folder, ignore_errors=True)
        side = max(height, width)
        made = synthesize_scenes(SynthConfig(out_dir=folder, scenes=count, size_px=side))
        if height != width:
            for image, label in zip(made.image_paths, made.label_paths, strict=True):
                crop_to(image, rasterio.windows.Window(0, 0, width, height))
                with rasterio.open(image) as ds:
                    bounds = ds.bounds
                with rasterio.open(label) as ds:
                    window = rasterio.windows.from_bounds(*bounds, transform=ds.transform)
                crop_to(label, window.round_offsets().round_lengths())
        images = sorted(naip.glob("*.tif"))
    with rasterio.open(images[0]) as ds:
        shape = ds.height, ds.width
    return Scenes(images, sorted(labels.glob("*.tif")), *shape)


def crop_to(path: Path, window: rasterio.windows.Window) -> None:
    """Rewrite the GeoTIFF at `path` as its `window`, with the same creation options."""
    with rasterio.open(path) as ds:
        data = ds.read(window=window)
        profile = ds.profile | {
            "height": data.shape[1],
            "width": data.shape[2],
            "transform": rasterio.windows.transform(window, ds.transform),
        }
    tmp = path.with_suffix(".crop.tif")
    with rasterio.open(tmp, "w", **profile) as out:
        out.write(data)
    tmp.replace(path)


# --- whole processes, side by side ------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of the timed processes: bytecode may be cached, as after an install."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed_process(argv: Sequence[str]) -> tuple[float, float]:
    """(wall s, CPU s) of a child process run to its end; RuntimeError if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({proc.returncode}): {stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def ours_argv(scenes: Scenes, out: Path) -> list[str]:
    label_dir = scenes.labels[0].parent
    return [sys.executable, "-m", "landcover", "-q", "tile",
            *map(str, scenes.images), "--labels", str(label_dir), "--out", str(out),
            "--workers", "1", "--min-valid", "0", "--overwrite"]  # fmt: skip


def limit_argv(scenes: Scenes, out: Path) -> list[str]:
    return [sys.executable, "-c", LIMIT_SCRIPT, str(out), str(ZSTD_LEVEL), str(STRIP_ROWS),
            *map(str, scenes.images), *map(str, scenes.labels)]  # fmt: skip


def chunk_params_json(level: int) -> str:
    """The store encoder's zstd parameters at `level`, as keywords of
    `zstandard.ZstdCompressionParameters`."""
    params = chunk_compression_parameters(level)
    names = ("window_log", "chain_log", "hash_log", "search_log", "min_match",
             "target_length", "strategy", "write_content_size", "write_checksum")  # fmt: skip
    return json.dumps({name: getattr(params, name) for name in names})


def limit_chips_argv(scenes: Scenes, out: Path) -> list[str]:
    return [sys.executable, "-c", LIMIT_CHIPS_SCRIPT, str(out), chunk_params_json(ZSTD_LEVEL),
            str(CHIP), *map(str, scenes.images), *map(str, scenes.labels)]  # fmt: skip


def whole_process_vs_limit(scenes: Scenes, work: Path, repeat: int) -> None:
    """Ours and the limits as whole processes, in turn (the order rotating), medians of
    `repeat` runs each."""
    store, limit_dir, chips_dir = work / "ours.zarr", work / "limit", work / "limit_chips"
    limit_dir.mkdir(exist_ok=True)
    chips_dir.mkdir(exist_ok=True)
    argvs = {
        "ours": ours_argv(scenes, store),
        "limit": limit_argv(scenes, limit_dir),
        "chips": limit_chips_argv(scenes, chips_dir),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
    for name in argvs:  # warm-up: bytecode compiled, inputs in the page cache
        timed_process(argvs[name])
    names = list(argvs)
    for k in range(repeat):
        for name in names[k % 3 :] + names[: k % 3]:
            runs[name].append(timed_process(argvs[name]))
        print(
            f"  run {k + 1}: ours {runs['ours'][-1][0]:.2f} s, limit "
            f"{runs['limit'][-1][0]:.2f} s, limit for chips {runs['chips'][-1][0]:.2f} s "
            f"wall; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    median = {name: tuple(statistics.median(r[i] for r in rs) for i in (0, 1))
              for name, rs in runs.items()}  # fmt: skip
    pair_ratios = [lim[0] / our[0] for our, lim in zip(runs["ours"], runs["limit"], strict=True)]
    ours_wall, ours_cpu = median["ours"]
    limit_wall, limit_cpu = median["limit"]
    chips_wall, chips_cpu = median["chips"]
    print(
        f"\n## One worker\n\n{len(scenes.images)} scenes of {scenes.height} x {scenes.width} "
        f"px x 4 bands + labels; whole processes, medians of {repeat} alternating runs\n"
    )
    print("| run | wall s | CPU s | ours / this (wall) | ours / this (CPU) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| `landcover tile --workers 1` (ours, whole process) | {ours_wall:.2f} | "
          f"{ours_cpu:.2f} | 1.00× | 1.00× |")  # fmt: skip
    print(f"| limit: rasterio read + zstd in {STRIP_ROWS}-row strips + write + fsync (whole "
          f"process) | {limit_wall:.2f} | {limit_cpu:.2f} | {limit_wall / ours_wall:.2f}× | "
          f"{limit_cpu / ours_cpu:.2f}× |")  # fmt: skip
    print(f"| limit for chips: the same, zstd over the store's {CHIP} px chips (whole process) "
          f"| {chips_wall:.2f} | {chips_cpu:.2f} | {chips_wall / ours_wall:.2f}× | "
          f"{chips_cpu / ours_cpu:.2f}× |")  # fmt: skip
    chip_ratios = [c[0] / our[0] for our, c in zip(runs["ours"], runs["chips"], strict=True)]
    print(
        f"\nours vs limit, whole process, one worker: {limit_wall / ours_wall:.2f}x of the "
        f"limit by median wall time (median of paired runs {statistics.median(pair_ratios):.2f}x), "
        f"{limit_cpu / ours_cpu:.2f}x by CPU time (goal >= {ONE_WORKER_GOAL}x); against the "
        f"limit for chips {chips_wall / ours_wall:.2f}x by wall time (paired "
        f"{statistics.median(chip_ratios):.2f}x), {chips_cpu / ours_cpu:.2f}x by CPU time; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


# --- in this process: the parts of ours, and every method at --workers --------------------------


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its finished child processes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def best_of(repeat: int, run: Callable[[], int]) -> tuple[float, float, int]:
    """(wall s, CPU s, chips) of the fastest of `repeat` runs of `run`."""
    best = (float("inf"), 0.0, 0)
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), cpu_seconds()
        chips = run()
        wall = time.perf_counter() - start
        if wall < best[0]:
            best = (wall, cpu_seconds() - start_cpu, chips)
    return best


def run_ours(scenes: Scenes, work: Path, workers: int) -> int:
    out = work / "ours.zarr"
    shutil.rmtree(out, ignore_errors=True)
    config = TileConfig(
        images=tuple(map(str, scenes.images)),
        labels=(str(scenes.labels[0].parent),),
        out=str(out),
        chip_size=CHIP,
        min_valid=0.0,  # keep every chip: the same work as the baselines
        workers=workers,
    )
    return tile(config).summary.num_chips


def chip_origins(height: int, width: int) -> list[tuple[int, int]]:
    return [
        (r, c) for r in chip_offsets(height, CHIP, CHIP) for c in chip_offsets(width, CHIP, CHIP)
    ]


def run_per_chip_geotiffs(scenes: Scenes, work: Path, workers: int) -> tuple[int, str]:
    """Baseline (a): one GeoTIFF per image chip and per label chip."""
    out = work / "per_chip"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    gdal = shutil.which("gdal_translate")
    jobs: list[tuple[Path, int, int, Path]] = []
    chips = 0
    for k, (image, labels) in enumerate(zip(scenes.images, scenes.labels, strict=True)):
        with rasterio.open(image) as ds:
            origins = chip_origins(ds.height, ds.width)
        chips += len(origins)
        jobs += [(src, r, c, out / f"{tag}{k}_{r}_{c}.tif") for r, c in origins
                 for tag, src in (("naip", image), ("lc", labels))]  # fmt: skip
    if gdal:

        def cut(job: tuple[Path, int, int, Path]) -> None:
            src, r, c, dst = job
            subprocess.run(
                [gdal, "-q", "-of", "GTiff", "-srcwin", str(c), str(r), str(CHIP), str(CHIP),
                 str(src), str(dst)],
                check=True,
            )  # fmt: skip

        name = f"(a) gdal_translate -srcwin, 1 GeoTIFF per chip, {workers} procs"
    else:

        def cut(job: tuple[Path, int, int, Path]) -> None:
            src, r, c, dst = job
            window = rasterio.windows.Window(c, r, CHIP, CHIP)
            with rasterio.open(src) as ds:
                data = ds.read(window=window)
                profile = ds.profile | {
                    "width": CHIP, "height": CHIP, "tiled": False, "compress": None,
                    "transform": rasterio.windows.transform(window, ds.transform),
                }  # fmt: skip
            with rasterio.open(dst, "w", **profile) as dst_ds:
                dst_ds.write(data)

        name = f"(a) rasterio window -> 1 GeoTIFF per chip ({workers} threads; no gdal_translate)"
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(cut, jobs))
    return chips, name


def run_limit(scenes: Scenes, workers: int) -> int:
    """Baseline (b) in this process: whole-scene reads + zstd of every chip (the store
    encoder's parameters, a compressor per thread), nothing else."""
    params = chunk_compression_parameters(ZSTD_LEVEL)
    local = threading.local()

    def zstd_len(chip: np.ndarray[Any, Any]) -> int:
        if not hasattr(local, "compressor"):
            local.compressor = zstandard.ZstdCompressor(compression_params=params)
        return len(local.compressor.compress(chip.data))

    chips = 0
    for image, labels in zip(scenes.images, scenes.labels, strict=True):
        with rasterio.Env(GDAL_NUM_THREADS=str(workers)):
            with rasterio.open(image) as ds:
                pixels = ds.read()
            with rasterio.open(labels) as ds:
                codes = ds.read(1)
        origins = chip_origins(pixels.shape[1], pixels.shape[2])

        def compress(
            origin: tuple[int, int],
            pixels: np.ndarray[Any, Any] = pixels,
            codes: np.ndarray[Any, Any] = codes,
        ) -> int:
            r, c = origin
            image_chip = np.ascontiguousarray(pixels[:, r : r + CHIP, c : c + CHIP])
            label_chip = np.ascontiguousarray(codes[r : r + CHIP, c : c + CHIP])
            return zstd_len(image_chip) + zstd_len(label_chip)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(compress, origins))
        chips += len(origins)
    return chips


@contextmanager
def timed_parts() -> Iterator[dict[str, list[float]]]:
    """While open, each of TIMED_PARTS adds up its [wall s, CPU s] (all calls, all threads).

    CPU seconds are those of the calling thread (each part runs in one): unlike wall time,
    other load on the machine barely moves them.
    """
    totals = {label: [0.0, 0.0] for label, _, _ in TIMED_PARTS}
    lock = threading.Lock()

    def timer(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
                with lock:
                    totals[label][0] += wall
                    totals[label][1] += cpu

        return timed

    originals = [(owner, name, getattr(owner, name)) for _, owner, name in TIMED_PARTS]
    for (label, _, _), (owner, name, original) in zip(TIMED_PARTS, originals, strict=True):
        setattr(owner, name, timer(label, original))
    try:
        yield totals
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def where_time_goes(scenes: Scenes, work: Path) -> None:
    """One in-process run of ours with --workers 1, its parts timed."""
    with timed_parts() as totals:
        start, start_cpu = time.perf_counter(), cpu_seconds()
        run_ours(scenes, work, 1)
        wall, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    print(
        f"\n## One worker parts\n\nwhere ours' time goes in `tile()` (--workers 1, in this "
        f"process, imports excluded: {wall:.2f} s wall, {cpu:.2f} s CPU; windows are read while "
        "earlier ones are compressed, and written while later ones are; a cutting thread "
        "waiting for its window counts in its wall time)\n"
    )
    prepare = [totals[label] for label, _, _ in TIMED_PARTS[3:6]]  # and its parts
    rows = list(totals.items())
    rest = [prepare[0][k] - sum(part[k] for part in prepare[1:]) for k in (0, 1)]
    rows.insert(6, ("  rest: masks, chips picked", rest))
    print("| part | wall s | CPU s |")
    print("|---|---:|---:|")
    for label, (part_wall, part_cpu) in rows:
        print(f"| {label.strip()} | {part_wall:.2f} | {part_cpu:.2f} |")


def workers_table(scenes: Scenes, work: Path, workers: int, repeat: int, baseline: bool) -> None:
    chip_bytes = 5 * CHIP * CHIP  # 4 image bands + 1 label band
    rows: list[Row] = []
    wall, cpu, chips = best_of(repeat, lambda: run_ours(scenes, work, workers))
    rows.append(Row(f"landcover tile (ours), --workers {workers}", wall, cpu, chips,
                    chips * chip_bytes))  # fmt: skip
    wall, cpu, chips = best_of(repeat, lambda: run_limit(scenes, workers))
    rows.append(Row(f"(b) limit: rasterio read + zstd only, {workers} threads", wall, cpu,
                    chips, chips * chip_bytes))  # fmt: skip
    if baseline:
        start, start_cpu = time.perf_counter(), cpu_seconds()
        chips, name = run_per_chip_geotiffs(scenes, work, workers)
        rows.append(Row(name, time.perf_counter() - start, cpu_seconds() - start_cpu, chips,
                        chips * chip_bytes))  # fmt: skip
    print(f"\n## Workers\n\nevery method at --workers {workers}, in this process, best of "
          f"{repeat}; load average after: {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| method | wall s | CPU s | chips | chips/s | MB/s | ours / this (wall) | "
          "ours / this (CPU) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ours = rows[0]
    for r in rows:
        print(f"| {r.name} | {r.seconds:.2f} | {r.cpu_seconds:.2f} | {r.chips} | "
              f"{r.chips_per_s:.1f} | {r.mb_per_s:.1f} | {r.seconds / ours.seconds:.2f}× | "
              f"{r.cpu_seconds / ours.cpu_seconds:.2f}× |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2048 x 2048 px scenes")
    parser.add_argument("--size", type=int, nargs=2, metavar=("ROWS", "COLS"),
                        help="scene size [7500 6000]")  # fmt: skip
    parser.add_argument("--scenes", type=int, default=3, help="scenes in the one command [3]")
    parser.add_argument(
        "--scenes-dir",
        type=Path,
        help="keep the synthetic scenes here and reuse them [a temporary folder]",
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, alternating [5]")
    parser.add_argument("--no-parts", action="store_true", help="leave out where time goes")
    parser.add_argument("--workers-table", action="store_true",
                        help="also every method at --workers, in this process")  # fmt: skip
    parser.add_argument("--workers", type=int, default=local_cpu_count(),
                        help="threads/processes for --workers-table [all cores]")  # fmt: skip
    parser.add_argument("--skip-baseline", action="store_true",
                        help="leave the per-chip GeoTIFFs out of --workers-table")  # fmt: skip
    args = parser.parse_args(argv)
    height, width = args.size or (QUICK_SIZE if args.quick else NAIP_SIZE)
    with tempfile.TemporaryDirectory(prefix="bench_tile_") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        scenes = make_scenes(args.scenes_dir or work / "scenes", args.scenes, height, width)
        megabytes = sum(p.stat().st_size for p in scenes.images) / 1e6
        print(
            f"# {len(scenes.images)} synthetic scenes of {scenes.height} x {scenes.width} x 4 "
            f"uint8 + 1 m labels ({megabytes:.0f} MB of deflate GeoTIFF), ready in "
            f"{time.perf_counter() - start:.0f} s; {CHIP} px chips; {os.cpu_count()} cores; "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        whole_process_vs_limit(scenes, work, args.repeat)
        if not args.no_parts:
            where_time_goes(scenes, work)
        if args.workers_table:
            workers_table(scenes, work, args.workers, args.repeat, not args.skip_baseline)


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_tile.py"):
        main()
