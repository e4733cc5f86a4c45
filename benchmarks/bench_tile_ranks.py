"""Distributed tiling: `landcover tile --workers 1` as one process and as `--nproc 2` ranks.

The same synthetic NAIP-like scenes and labels (`tiling.synthetic.scenes`, written once to a
temporary folder) are cut into 256 px chips by `landcover tile` run as a subprocess, the way a user
runs it: as one process (free to use both cores, and on one core: a rank's share of a node
whose every core runs a rank), and as 2 ranks on the local engine (`--nproc 2`, one reader
thread per rank). Prints chips/s per rank count, the speed-up (goal >= 1.8x on 2 cores), the
commit's share of rank 0's time (its log line: parts, MB, seconds, objects moved in), whether
the two stores are byte-identical, and an estimate for a state (4,000 NAIP quarter-quads,
~2.7 M chips) on 16 and 64 nodes from the measured per-rank rate, the measured commit rate
and the per-source cost of a commit (measured by bench_store_records.py's writer loop).

The machine's own limit for 2 ranks is measured too: 2 unrelated one-process runs started
together, each on one core and on the sources one rank of 2 cuts (no staging, no commit, no
coordination). What they lose against one process doing it all is the cost of sharing the
machine (memory bandwidth, caches, each process's own start), which no protocol removes.
Best of `--repeat` (each time its own best); never asserts on time.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench_store_records import commit_all

from tiling.chipstore.store import open_store
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes
from tiling.tiler.blobcopy import COPY_THREADS
from tiling.tiler.commit import assign_sources

CHIP = 256
SHARD = 64  # `landcover tile`'s default --shard-size
STATE_FILES = 4_000
STATE_CHIPS = 2_700_000
NODES = (16, 64)
SOURCE_COMMITS = 200  # commits timed for the per-source cost (it stays flat: format 3)
COMMIT_LINE = re.compile(
    r"committed (\d+) parts, ([\d.]+) MB in ([\d.]+) s .*?(\d+) interior objects moved in"
)
RANK_LINE = re.compile(r"wrote .* in ([\d.]+) s with")


@dataclass(frozen=True)
class Run:
    ranks: int
    wall_s: float  # the command, launch included
    inside_s: float  # rank 0's own time in tile() (its summary line)
    cpu_s: float  # CPU time of every process of the command (launcher and ranks)
    chips: int
    commit_mb: float = 0.0
    commit_s: float = 0.0
    moved: int = 0

    @property
    def chips_per_s(self) -> float:
        return self.chips / self.wall_s


def tile_once(images: Path, labels: Path, out: Path, ranks: int, *, one_core: bool = False) -> Run:
    """One `landcover tile` run as `ranks` ranks; `one_core`: the process may use one core."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "-m", "landcover", "-v", "tile", str(images / "*.tif"),
        "--labels", str(labels), "--out", str(out), "--chip-size", str(CHIP),
        "--min-valid", "0", "--workers", "1",
    ]  # fmt: skip
    if ranks > 1:
        command += ["--nproc", str(ranks)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=(lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
        if one_core
        else None,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"tile with {ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    output = done.stdout + done.stderr
    inside = [float(m.group(1)) for m in RANK_LINE.finditer(output)]
    commit = COMMIT_LINE.search(output)
    return Run(
        ranks=ranks,
        wall_s=wall,
        inside_s=min(inside) if inside else wall,
        cpu_s=cpu,
        chips=open_store(str(out)).summary.num_chips,
        commit_mb=float(commit.group(2)) if commit else 0.0,
        commit_s=float(commit.group(3)) if commit else 0.0,
        moved=int(commit.group(4)) if commit else 0,
    )


def halves_once(images: list[list[Path]], labels: Path, work: Path) -> Run:
    """The machine's limit: one one-process `tile` per share of `images`, all started
    together, each pinned to its own core; the slowest share's times, CPU summed."""
    cores = sorted(os.sched_getaffinity(0))
    procs, outs = [], []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for i, share in enumerate(images):
        out = work / f"share{i}.zarr"
        shutil.rmtree(out, ignore_errors=True)
        outs.append(out)
        command = [
            sys.executable, "-m", "landcover", "tile", *map(str, share), "--labels", str(labels),
            "--out", str(out), "--chip-size", str(CHIP), "--min-valid", "0", "--workers", "1",
        ]  # fmt: skip
        core = cores[i % len(cores)]
        procs.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=functools.partial(os.sched_setaffinity, 0, {core}),
            )
        )
    inside, walls = [], []
    for proc in procs:
        stdout, stderr = proc.communicate()
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"tile of one share failed:\n{stderr[-3000:]}")
        found = RANK_LINE.search(stdout)
        inside.append(float(found.group(1)) if found else walls[-1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Run(
        ranks=len(images),
        wall_s=max(walls),
        inside_s=max(inside),
        cpu_s=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        chips=sum(open_store(str(out)).summary.num_chips for out in outs),
    )


def best_of(
    repeat: int, images: Path, labels: Path, out: Path, ranks: int, *, one_core: bool = False
) -> Run:
    """Each time at its best over `repeat` runs (least disturbed: wall, in-rank and CPU time
    each their own minimum); every run's times are printed."""
    runs = [tile_once(images, labels, out, ranks, one_core=one_core) for _ in range(repeat)]
    where = " on one core" if one_core else ""
    print(f"  {ranks} rank(s){where}, wall s: {', '.join(f'{r.wall_s:.2f}' for r in runs)}; "
          f"in-rank s: {', '.join(f'{r.inside_s:.2f}' for r in runs)}", flush=True)  # fmt: skip
    best = min(runs, key=lambda r: r.wall_s)
    return replace(
        best,
        inside_s=min(r.inside_s for r in runs),
        cpu_s=min(r.cpu_s for r in runs),
    )


def same_bytes(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)


def store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 scenes of 2048 px")
    parser.add_argument("--scenes", type=int, default=None, help="[8; --quick: 4]")
    parser.add_argument("--size", type=int, default=None, help="scene px [4096; --quick: 2048]")
    parser.add_argument("--repeat", type=int, default=None, help="best of N [3; --quick: 1]")
    parser.add_argument("--ranks-per-node", type=int, default=16,
                        help="ranks per node assumed by the state estimate [16]")  # fmt: skip
    parser.add_argument("--commit-gbps", type=float, default=1.0,
                        help="GB/s rank 0 reads and writes storage at [1.0]")  # fmt: skip
    parser.add_argument("--rename-ms", type=float, default=1.0,
                        help="ms per rename on the shared file system (an NFS round trip) "
                        "[1.0]")  # fmt: skip
    parser.add_argument("--copy-ms", type=float, default=50.0,
                        help="ms per server-side blob copy (Copy Blob From URL of a shard "
                        "object) [50]")  # fmt: skip
    parser.add_argument("--put-ms", type=float, default=30.0,
                        help="ms per blob PUT round trip: a commit's record, then its group "
                        "attribute, one after the other [30]")  # fmt: skip
    args = parser.parse_args(argv)
    scenes = args.scenes or (4 if args.quick else 8)
    size = args.size or (2048 if args.quick else 4096)
    repeat = args.repeat or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench_tile_ranks_") as tmp:
        work = Path(tmp)
        synth = synthesize_scenes(SynthConfig(out_dir=work / "s", scenes=scenes, size_px=size))
        images, labels = synth.image_paths[0].parent, synth.label_paths[0].parent
        print(f"{scenes} scenes of {size} x {size} px + labels, {CHIP} px chips, --workers 1 "
              f"per rank; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}",
              flush=True)  # fmt: skip
        one = best_of(repeat, images, labels, work / "one.zarr", 1)
        pinned = best_of(repeat, images, labels, work / "one.zarr", 1, one_core=True)
        two = best_of(repeat, images, labels, work / "two.zarr", 2)
        paths = sorted(images.glob("*.tif"))
        owners = assign_sources([one.chips // len(paths)] * len(paths), 2)
        shares = [[p for p, o in zip(paths, owners, strict=True) if o == r] for r in (0, 1)]
        limits = [halves_once(shares, labels, work) for _ in range(repeat)]
        print(f"  2 unrelated processes (the limit), wall s: "
              f"{', '.join(f'{r.wall_s:.2f}' for r in limits)}; in-process s: "
              f"{', '.join(f'{r.inside_s:.2f}' for r in limits)}", flush=True)  # fmt: skip
        limit = replace(
            min(limits, key=lambda r: r.wall_s),
            inside_s=min(r.inside_s for r in limits),
            cpu_s=min(r.cpu_s for r in limits),
        )
        identical = same_bytes(work / "one.zarr", work / "two.zarr")
        per_chip = store_bytes(work / "one.zarr") / one.chips
        per_source = sorted(commit_all(str(work / "records.zarr"), SOURCE_COMMITS))
        source_commit_s = per_source[len(per_source) // 2]
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    report(
        one,
        pinned,
        two,
        limit,
        identical,
        per_chip,
        args.ranks_per_node,
        args.commit_gbps,
        args.rename_ms,
        args.copy_ms,
        source_commit_s,
        args.put_ms,
    )


def report(
    one: Run,
    pinned: Run,
    two: Run,
    limit: Run,
    identical: bool,
    per_chip_bytes: float,
    per_node: int,
    gbps: float,
    rename_ms: float,
    copy_ms: float,
    source_commit_s: float,
    put_ms: float,
) -> None:
    print(f"\n{'ranks':>5}  {'wall s':>7}  {'in-rank s':>9}  {'CPU s':>6}  {'chips':>6}  "
          f"{'chips/s':>8}")  # fmt: skip
    for label, r in (("1", one), ("1 *", pinned), ("2", two), ("2 **", limit)):
        print(f"{label:>5}  {r.wall_s:7.2f}  {r.inside_s:9.2f}  {r.cpu_s:6.2f}  {r.chips:6d}  "
              f"{r.chips_per_s:8.1f}")  # fmt: skip
    print("(* on one core: a rank's share of a node whose every core runs a rank; ** 2 unrelated "
          "processes, one core and one rank's sources each: the machine's limit)")  # fmt: skip
    for base, what in ((one, "free to use both cores"), (pinned, "on one core")):
        print(f"speed-up 2 ranks / 1 rank {what}: {base.wall_s / two.wall_s:.2f}x by wall time "
              f"(launch included), {base.inside_s / two.inside_s:.2f}x inside the ranks "
              "(goal >= 1.8x on 2 cores)")  # fmt: skip
    print(f"the machine's limit for 2 processes / 1 rank on one core: "
          f"{pinned.wall_s / limit.wall_s:.2f}x by wall time, "
          f"{pinned.inside_s / limit.inside_s:.2f}x inside; 2 ranks reach "
          f"{100 * limit.wall_s / two.wall_s:.0f} % of it by wall time, "
          f"{100 * limit.inside_s / two.inside_s:.0f} % inside")  # fmt: skip
    commit_rate = two.commit_mb / two.commit_s if two.commit_s else float("nan")
    share = two.commit_s / two.inside_s if two.inside_s else float("nan")
    print(f"commit (rank 0, 2 ranks): {two.commit_mb:.1f} MB appended (its own sources and the "
          f"shards two sources share) and {two.moved} interior shard objects of rank 1's moved "
          f"in, in {two.commit_s:.2f} s ({commit_rate:.0f} MB/s), {100 * share:.1f} % of rank "
          "0's time")  # fmt: skip
    print(f"stores byte-identical: {'yes' if identical else 'NO'}")
    rate = pinned.chips / pinned.inside_s  # one rank on one core, as 16 ranks on 16 cores
    state_bytes = STATE_CHIPS * per_chip_bytes
    print(f"\nstate estimate ({STATE_FILES} quarter-quads, {STATE_CHIPS / 1e6:.1f} M chips, "
          f"{per_chip_bytes / 1e3:.0f} kB stored per chip as measured here = "
          f"{state_bytes / 1e9:.0f} GB): {per_node} ranks per node at the measured "
          f"{rate:.1f} chips/s per rank")  # fmt: skip
    commit_here = 0.0 if math.isnan(commit_rate) else state_bytes / (commit_rate * 1e6)
    # Rank 0 writes its own sources and the shards two sources share (one per boundary
    # between sources: ~9 % of the bytes at NAIP's ~675 chips per quarter-quad), reading the
    # shared chunks from the parts; it moves the other objects in: a rename on a shared file
    # system, a server-side copy on blob storage (COPY_THREADS in flight).
    shared = min(1.0, SHARD / (STATE_CHIPS / STATE_FILES))
    moves = 3 * STATE_CHIPS / SHARD  # images, labels and index objects per shard
    through = 2 * shared * state_bytes / (gbps * 1e9)
    # Every source's commit writes its record, then the group attribute (the commit point):
    # measured on this disk; on blob storage two round trips one after the other.
    sources_fs = STATE_FILES * source_commit_s
    sources_blob = STATE_FILES * (source_commit_s + 2 * put_ms / 1e3)
    commit_fs = through + moves * rename_ms / 1e3 + sources_fs
    commit_blob = through + moves * copy_ms / 1e3 / COPY_THREADS + sources_blob
    print(f"  commit bound through rank 0: {100 * shared:.0f} % of the bytes ({through / 60:.1f} "
          f"min at {gbps:g} GB/s; {commit_here * shared / 60:.1f} min at this disk's rate) and "
          f"{moves / 1e3:.0f} k objects moved in: on a shared file system "
          f"{commit_fs / 60:.1f} min (renames at {rename_ms:g} ms), on blob storage "
          f"{commit_blob / 60:.1f} min (server-side copies at {copy_ms:g} ms, "
          f"{COPY_THREADS} in flight); both include {STATE_FILES} source commits "
          f"({1e3 * source_commit_s:.1f} ms each measured here: {sources_fs / 60:.1f} min; "
          f"{sources_blob / 60:.1f} min with 2 PUTs at {put_ms:g} ms)")  # fmt: skip
    for nodes in NODES:
        cut_s = STATE_CHIPS / (nodes * per_node * rate)
        print(f"  {nodes:3d} nodes: cutting {cut_s / 60:6.1f} min; wall ~"
              f"{max(cut_s, commit_blob) / 60:.1f} min on blob storage, ~"
              f"{max(cut_s, commit_fs) / 60:.1f} min on a shared file system")  # fmt: skip
    print(
        "(cutting and committing overlap: the wall time is about the larger of the two; "
        "numbers from a machine other work shares are optimistic for neither)"
    )


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_tile_ranks.py"):
        sys.exit(main())
