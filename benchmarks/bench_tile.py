"""Tiling throughput: `landcover tile` side by side with the old way and with the machine limit.

One NAIP-sized synthetic scene (45 Mpx x 4 bands, the pixel count of a 6000 x 7500 NAIP
quarter quad; `--quick`: 2048 x 2048) and its 1 m labels, written once to a temporary folder
by `tiling.synth`, then cut into the same 256 px chips (image + label) three ways:

- ours: `tiling.tile.tile` (the library call behind `landcover tile`), --workers = cores,
  writing a sharded, zstd-compressed Zarr v3 store with index, stats and class counts.
- (a) the original Azure land-cover tutorial's approach: one GeoTIFF per chip (and one per
  label chip) cut with `gdal_translate -srcwin`, as many processes at once as there are cores.
  Without gdal_translate it falls back to rasterio writing the same per-chip GeoTIFFs (the
  table then says so).
- (b) the limit: read the whole scene with rasterio (GDAL decoding on every core), then
  compress the very same chip bytes with the same codec (zstd at the store's level) on every
  core. No store, no index, no statistics: what the hardware does for the unavoidable work.

First ours with one worker against the limit in one thread (same process, one GDAL thread,
one compressing thread; goal >= 0.8x of the limit), with where ours' time goes: one more
run with the parts of `tile` timed (plan, fingerprints, reads, compression, the rest of the
per-window work, shard writes, attributes). Then the table at `--workers`. Ours and (b) are
timed best of `--repeat`; (a) once (it takes minutes). Never asserts on time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.windows
from numcodecs import Zstd

import tiling.append
import tiling.cut
import tiling.planfile
import tiling.rankplan
from tiling.config import COMPRESSION_LEVEL
from tiling.grid import chip_offsets
from tiling.reader import RasterReader
from tiling.shards import ChunkEncoder
from tiling.shared.machine import local_cpu_count
from tiling.synth import SynthConfig, synthesize_scenes
from tiling.tile import TileConfig, tile
from tiling.writer import ChipStoreWriter

CHIP = 256
NAIP_PX = 6708  # 6708² ≈ 45.0 Mpx = 6000 x 7500
QUICK_PX = 2048
ZSTD_LEVEL = COMPRESSION_LEVEL  # what `landcover tile` uses
ONE_WORKER_GOAL = 0.8  # of the limit's throughput, issue 15

# The parts of `tile` timed for the breakdown: (label, owner, attribute). Indented labels are
# parts of the one above them.
TIMED_PARTS: tuple[tuple[str, Any, str], ...] = (
    ("plan: inputs checked, chip grid, split", tiling.planfile, "plan_tiling"),
    ("fingerprints of the inputs", tiling.rankplan, "fingerprints"),
    ("open the store", tiling.append, "open_writer"),
    ("worker: windows cut (_cut_window)", tiling.cut, "_cut_window"),
    ("  read image: GDAL + valid mask", RasterReader, "read_image"),
    ("  read labels: GDAL + class map", RasterReader, "read_labels"),
    ("  compress chips: zstd + crc32c", ChunkEncoder, "encode"),
    ("writer: shard objects assembled + written", ChipStoreWriter, "_flush"),
    ("writer: group attributes", ChipStoreWriter, "write_attrs"),
)


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


def run_ours(image: Path, labels: Path, work: Path, workers: int) -> int:
    out = work / "ours.zarr"
    shutil.rmtree(out, ignore_errors=True)
    config = TileConfig(
        images=(str(image),),
        labels=(str(labels),),
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


def run_per_chip_geotiffs(image: Path, labels: Path, work: Path, workers: int) -> tuple[int, str]:
    """Baseline (a): one GeoTIFF per image chip and per label chip."""
    out = work / "per_chip"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    with rasterio.open(image) as ds:
        origins = chip_origins(ds.height, ds.width)
    gdal = shutil.which("gdal_translate")
    jobs = [(src, r, c, out / f"{tag}_{r}_{c}.tif") for r, c in origins
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
    return len(origins), name


def run_limit(
    image: Path, labels: Path, workers: int, parts: dict[str, float] | None = None
) -> int:
    """Baseline (b): whole-scene read + zstd of every chip, nothing else.

    `parts` receives the wall and CPU seconds of the read and of the compression.
    """
    start, start_cpu = time.perf_counter(), time.process_time()
    with rasterio.Env(GDAL_NUM_THREADS=str(workers)):
        with rasterio.open(image) as ds:
            pixels = ds.read()
        with rasterio.open(labels) as ds:
            codes = ds.read(1)
    read_s, read_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    origins = chip_origins(pixels.shape[1], pixels.shape[2])
    zstd = Zstd(level=ZSTD_LEVEL)

    def compress(origin: tuple[int, int]) -> int:
        r, c = origin
        image_chip = np.ascontiguousarray(pixels[:, r : r + CHIP, c : c + CHIP])
        label_chip = np.ascontiguousarray(codes[r : r + CHIP, c : c + CHIP])
        return len(zstd.encode(image_chip)) + len(zstd.encode(label_chip))

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(compress, origins))
    if parts is not None:
        parts.update(
            read=read_s,
            zstd=time.perf_counter() - start - read_s,
            read_cpu=read_cpu,
            zstd_cpu=time.process_time() - start_cpu - read_cpu,
        )
    return len(origins)


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


def one_worker_vs_limit(image: Path, labels: Path, work: Path, repeat: int) -> None:
    """Ours with --workers 1 against the limit in one thread, and where ours' time goes."""
    ours_s, ours_cpu, _ = best_of(repeat, lambda: run_ours(image, labels, work, 1))
    limit_s, limit_cpu, limit_parts = float("inf"), 0.0, {}
    for _ in range(repeat):
        parts: dict[str, float] = {}
        start, start_cpu = time.perf_counter(), cpu_seconds()
        run_limit(image, labels, 1, parts)
        if time.perf_counter() - start < limit_s:
            limit_s, limit_cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
            limit_parts = parts
    print(
        f"\none worker: ours (landcover tile --workers 1) {ours_s:.2f} s wall, {ours_cpu:.2f} s "
        f"CPU; limit in one thread {limit_s:.2f} s wall, {limit_cpu:.2f} s CPU (read image + "
        f"labels {limit_parts['read']:.2f} s wall, {limit_parts['read_cpu']:.2f} s CPU; zstd "
        f"{limit_parts['zstd']:.2f} s wall, {limit_parts['zstd_cpu']:.2f} s CPU)"
    )
    print(
        f"ours vs limit, one worker: {limit_s / ours_s:.2f}x of the limit by wall time, "
        f"{limit_cpu / ours_cpu:.2f}x by CPU time (goal >= {ONE_WORKER_GOAL}x)"
    )
    with timed_parts() as totals:
        start, start_cpu = time.perf_counter(), cpu_seconds()
        run_ours(image, labels, work, 1)
        wall, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    print(
        f"\nwhere ours' time goes (--workers 1; one more run, {wall:.2f} s wall, {cpu:.2f} s "
        "CPU, with these parts timed; the worker thread cuts windows while the writer "
        "writes earlier ones):"
    )
    cut = [totals[label] for label, _, _ in TIMED_PARTS[3:7]]  # _cut_window and its parts
    rows = list(totals.items())
    rows.insert(7, ("  rest: masks, counts, statistics, chip loop",
                    [cut[0][k] - sum(part[k] for part in cut[1:]) for k in (0, 1)]))  # fmt: skip
    print(f"  {'part':<46} {'wall s':>7} {'CPU s':>7}")
    for label, (part_wall, part_cpu) in rows:
        print(f"  {label:<46} {part_wall:7.2f} {part_cpu:7.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PX} px scene")
    parser.add_argument("--workers", type=int, default=local_cpu_count(),
                        help="threads/processes for every method [all cores]")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="best of N for ours and (b)")
    parser.add_argument("--skip-baseline", action="store_true", help="leave out (a)")
    args = parser.parse_args(argv)
    size = QUICK_PX if args.quick else NAIP_PX
    workers = args.workers
    with tempfile.TemporaryDirectory(prefix="bench_tile_") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        scene = synthesize_scenes(SynthConfig(out_dir=work / "scene", scenes=1, size_px=size))
        image, labels = scene.image_paths[0], scene.label_paths[0]
        print(
            f"scene: {size} x {size} x 4 uint8 + 1 m labels ({size * size / 1e6:.1f} Mpx, "
            f"{image.stat().st_size / 1e6:.0f} MB deflate GeoTIFF), made in "
            f"{time.perf_counter() - start:.0f} s; {CHIP} px chips; {workers} workers of "
            f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        one_worker_vs_limit(image, labels, work, args.repeat)
        chip_bytes = 5 * CHIP * CHIP  # 4 image bands + 1 label band
        rows: list[Row] = []
        wall, cpu, chips = best_of(args.repeat, lambda: run_ours(image, labels, work, workers))
        rows.append(Row(f"landcover tile (ours), --workers {workers}", wall, cpu, chips,
                        chips * chip_bytes))  # fmt: skip
        wall, cpu, chips = best_of(args.repeat, lambda: run_limit(image, labels, workers))
        rows.append(Row(f"(b) limit: rasterio read + zstd only, {workers} threads", wall, cpu,
                        chips, chips * chip_bytes))  # fmt: skip
        if not args.skip_baseline:
            start, start_cpu = time.perf_counter(), cpu_seconds()
            chips, name = run_per_chip_geotiffs(image, labels, work, workers)
            rows.append(Row(name, time.perf_counter() - start, cpu_seconds() - start_cpu, chips,
                            chips * chip_bytes))  # fmt: skip
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        print_table(rows)


def print_table(rows: list[Row]) -> None:
    ours = rows[0]
    width = max(len(r.name) for r in rows)
    print(f"\n{'method':<{width}}  {'wall s':>7}  {'CPU s':>7}  {'chips':>6}  {'chips/s':>8}  "
          f"{'MB/s':>7}  {'ours/this':>9}  {'ours/this CPU':>13}")  # fmt: skip
    for r in rows:
        print(f"{r.name:<{width}}  {r.seconds:7.2f}  {r.cpu_seconds:7.2f}  {r.chips:6d}  "
              f"{r.chips_per_s:8.1f}  {r.mb_per_s:7.1f}  {r.seconds / ours.seconds:8.2f}x  "
              f"{r.cpu_seconds / ours.cpu_seconds:12.2f}x")  # fmt: skip
    print("\nMB/s: raw chip pixels (4 bands + label) per wall second; ours/this: throughput of "
          "ours over that row's, by wall time and by CPU time (CPU time is the fair measure "
          "when other work shares the cores)")  # fmt: skip
    limit = next(r for r in rows if r.name.startswith("(b)"))
    print(
        f"ours vs (b) limit: {limit.seconds / ours.seconds:.2f}x of the limit by wall time, "
        f"{limit.cpu_seconds / ours.cpu_seconds:.2f}x by CPU time"
    )
    baseline = next((r for r in rows if r.name.startswith("(a)")), None)
    if baseline is not None:
        print(f"ours vs (a) per-chip GeoTIFFs: {baseline.seconds / ours.seconds:.1f}x faster by "
              f"wall time, {baseline.cpu_seconds / ours.cpu_seconds:.1f}x by CPU time "
              "(goal >= 5x)")  # fmt: skip


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_tile.py"):
        sys.exit(main())
