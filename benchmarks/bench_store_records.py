"""Committing sources at state scale: the writer's cost per source at the 4,000th source
against the first, format 3 beside format 2's group-attribute rewrites, replayed.

A chip store's group attribute is its commit point. Format 2 kept every source record in it
(with the parameters' list of all inputs and every label fingerprint) and rewrote it twice
per source; format 3 (`tiling.chipstore.source_table`) writes each record once into the `sources`
array, and the attribute keeps only counts and totals.

- ours: `ChipStoreWriter` commits `--sources` sources of one 64 px chip each (shard size 1:
  every commit writes one object per array, as a quarter-quad's last shard does), on local
  disk, timed per commit. Each record is as large as a real NAIP quarter-quad's: its CRS,
  transform and fingerprint are those of a file in tests/data/naip-real, its paths as long
  as a state's.
- format 2, replayed: the group attribute format 2 wrote after k sources (k records, the
  parameters with all inputs, all label fingerprints), written with zarr as the old writer
  did, timed at a few k and summed over k = 1..N (twice per source) by linear interpolation.
- opening the finished store (`open_store`: every record read and parsed) against parsing
  format 2's final attribute.

Everything on this machine's local disk; on blob storage every write is a round trip as
well (bench_tile_ranks.py's state estimate adds those). Never asserts on time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import zarr

from tiling.chipstore.params import StoreParams
from tiling.chipstore.records import BandStats, SourceRecord
from tiling.chipstore.resume import open_writer
from tiling.chipstore.store import ATTRS_KEY, open_store
from tiling.runtime.fingerprint import fingerprint
from tiling.sources.classes import get_class_map

NAIP_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "naip-real"
CHIP = 64
WINDOW = 100  # commits averaged at the start and at the end of the run
REPLAY_AT = (1, 1000, 2000, 3000, 4000)


def image_path(k: int) -> str:
    return f"/mnt/naip/va/2018/60cm/38077/m_3807701_ne_18_060_20180826_{k:05d}.tif"


def label_path(k: int) -> str:
    return f"/mnt/chesapeake/lc/va/m_3807701_ne_18_060_2018_lc_{k:05d}.tif"


def naip_record() -> SourceRecord:
    """The record of a real NAIP file (source 0, under a state-sized path)."""
    path = sorted(NAIP_DIR.glob("*.tif"))[0]
    with rasterio.open(path) as src:
        crs, transform = src.crs.to_wkt(), tuple(src.transform)[:6]
    return SourceRecord(
        id=0,
        path=image_path(0),
        crs=crs,
        transform=transform,  # type: ignore[arg-type]
        shape=(7600, 6200),
        start=0,
        chips=0,
        state="writing",
        resolution_m=0.6,
        nodata=0,
        label_paths=(label_path(0),),
        mask_kind="nodata",
        fingerprint=fingerprint(str(path)),
    )


def params_for(n: int) -> StoreParams:
    return StoreParams(
        chip_size=CHIP,
        stride=CHIP,
        shard_size=1,
        class_map=get_class_map("chesapeake7to5"),
        val_fraction=0.0,
        min_valid=0.0,
        split_block_chips=4,
        compression_level=3,
        images=tuple(image_path(k) for k in range(n)),
        labels=tuple(label_path(k) for k in range(n)),
    )


def commit_all(url: str, n: int) -> list[float]:
    """Seconds per commit (begin, append one chip, commit) of n sources, format 3."""
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, size=(1, 4, CHIP, CHIP), dtype=np.uint8)
    labels = rng.integers(0, 5, size=(1, CHIP, CHIP), dtype=np.uint8)
    stats = BandStats(sums=(10**9,) * 4, sums_sq=(10**11,) * 4, count=47 * 10**6)
    writer = open_writer(url, params_for(n))
    template = naip_record()
    times = []
    for k in range(n):
        record = replace(template, id=k, path=image_path(k), label_paths=(label_path(k),))
        index = np.array([[k, 0, 0, 0]], dtype=np.int32)
        start = time.perf_counter()
        writer.begin_source(record)
        writer.append(images, labels, index)
        writer.commit_source(
            band_stats=stats, class_counts=(1, 2, 3, 4, 5), train_chips=1, val_chips=0
        )
        times.append(time.perf_counter() - start)
    writer.finish()
    return times


def format_2_attribute(k: int, n: int, meta: dict[str, Any], record: dict[str, Any]) -> Any:
    """The group attribute format 2 wrote after k of n sources."""
    label_fp = record["fingerprint"]
    return {
        **meta,
        "version": 2,
        "params": params_for(n).to_json(),
        "label_fingerprints": {label_path(i): label_fp for i in range(n)},
        "sources": [{**record, "id": i, "path": image_path(i)} for i in range(k)],
    }


def replay_format_2(work: Path, n: int, meta: dict[str, Any], record: dict[str, Any]) -> float:
    """Seconds format 2 spent writing its group attribute over n sources (interpolated)."""
    group = zarr.open_group(str(work / "format2.zarr"), mode="w")
    at = sorted({min(k, n) for k in REPLAY_AT})
    cost = []
    for k in at:
        value = {ATTRS_KEY: format_2_attribute(k, n, meta, record)}
        start = time.perf_counter()
        for _ in range(3):
            group.update_attributes(value)
        cost.append((time.perf_counter() - start) / 3)
        print(f"  format 2, attribute after {k:5d} sources: {1e3 * cost[-1]:7.1f} ms per write")
    per_source = np.interp(np.arange(1, n + 1), at, cost)
    return float(2 * per_source.sum())  # begin_source and commit_source each wrote it


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=4000, help="sources committed [4000]")
    args = parser.parse_args(argv)
    n = args.sources
    with tempfile.TemporaryDirectory(prefix="bench_store_records_") as tmp:
        work = Path(tmp)
        url = str(work / "chips.zarr")
        print(f"{n} sources of one {CHIP} px chip each, records of a real NAIP file", flush=True)
        times = commit_all(url, n)
        start = time.perf_counter()
        store = open_store(url)
        open_s = time.perf_counter() - start
        assert len(store.summary.sources) == n
        meta = dict(zarr.open_group(url, mode="r").attrs[ATTRS_KEY])  # type: ignore[arg-type]
        record = store.summary.sources[0].to_json()
        old_total = replay_format_2(work, n, meta, record)
        start = time.perf_counter()
        final = zarr.open_group(str(work / "format2.zarr"), mode="r")
        old_meta = dict(final.attrs)[ATTRS_KEY]
        [SourceRecord.from_json(s) for s in old_meta["sources"]]  # type: ignore[index]
        old_open_s = time.perf_counter() - start
    window = min(WINDOW, n)
    first, last = np.mean(times[:window]), np.mean(times[-window:])
    total = sum(times)
    print(f"\nformat 3, ms per commit: first {window} sources {1e3 * first:.2f}, last {window} "
          f"{1e3 * last:.2f} ({last / first:.2f}x); all {n}: {total:.1f} s")  # fmt: skip
    print(f"format 2, the group attribute alone over {n} sources: {old_total:.0f} s "
          f"({old_total / total:.0f}x format 3's whole commits)")  # fmt: skip
    print(f"opening the store (every record read): format 3 {open_s:.2f} s, format 2's "
          f"attribute {old_open_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_store_records.py"):
        sys.exit(main())
