"""What a prediction sets up in the process (landcover.prediction.setup): freed memory kept
for the next batch, and handed back between blocks; GDAL's block cache sized to what the blocks
read again. The checks of inputs are tested through the runs in test_failures.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from landcover.prediction.outfiles import COG_BLOCK_PX
from landcover.prediction.setup import (
    GDAL_CACHE_BYTES,
    MIN_BLOCK_CACHE_BYTES,
    SOURCE_TILE_PX,
    block_cache_bytes,
)

# Runs in a child: malloc settings are process-wide. Allocates and frees 64 MiB arrays (the
# size of one activation of small_unet at batch 16) five times, as batches do; then a block
# that holds two of them at once. numpy's arrays are plain mallocs (its huge pages off, so that
# faults count 4 KiB pages): torch's are 64-byte aligned, which glibc serves from a freed chunk
# only when nothing was allocated right after it, a layout that varies from run to run.
_CHILD = r"""
import json, resource, sys
import numpy as np
from landcover.prediction.setup import FreedMemory

np._core.multiarray._set_madvise_hugepage(False)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

memory = FreedMemory()
if sys.argv[1] == "reuse":
    memory.reuse()
before = faults()
for _ in range(5):
    batch = np.ones(64 * 2**20, dtype=np.uint8)
    del batch
faults_5_batches = faults() - before
memory.release()  # the first block: sets the limit, keeps the pages
kept = rss_mib()
two = [np.ones(64 * 2**20, dtype=np.uint8) for _ in range(2)]
del two
second = rss_mib()
memory.release()  # the second block, with the logits kept from the first: raises the limit
settled = rss_mib()
three = [np.ones(64 * 2**20, dtype=np.uint8) for _ in range(4)]
del three
grown = rss_mib()
memory.release()  # over the limit: hands the free pages back
print(json.dumps({"faults": faults_5_batches, "kept_mib": kept, "second_mib": second,
                  "settled_mib": settled, "grown_mib": grown, "released_mib": rss_mib()}))
"""


def run_child(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_buffers_are_reused_and_released_once_rss_grows() -> None:
    default, reuse = run_child("default"), run_child("reuse")
    pages = 64 * 2**20 // 4096
    # By default each 64 MiB buffer is a fresh mmap: every page faults in every batch.
    assert default["faults"] > 4.5 * pages
    # Reused: the pages fault once, never once per batch as by default, and stay for the
    # next block.
    assert reuse["faults"] < 1.5 * pages
    assert reuse["kept_mib"] > 64
    # The second block needed more than the first (the logits kept from it): its pages stay
    # for the blocks after it.
    assert reuse["second_mib"] - reuse["kept_mib"] > 48
    assert reuse["second_mib"] - reuse["settled_mib"] < 16
    # A later block that needed more leaves RSS above the limit: the free pages go back.
    assert reuse["grown_mib"] - reuse["settled_mib"] > 48
    assert reuse["grown_mib"] - reuse["released_mib"] > 96


def test_block_cache_holds_what_the_blocks_read_again_and_no_more() -> None:
    mib = 2**20
    # A tile-aligned 2048 px block: its window's source tiles (4 bands, a 512 px tile's
    # margin each side), whatever the width; the output's tiles are finished block by block.
    aligned = block_cache_bytes(2048, 100_000, out_bands=1)
    assert aligned == 4 * (2048 + 2 * SOURCE_TILE_PX) ** 2
    assert block_cache_bytes(2048, 1_000, out_bands=8) == aligned
    # 256 px blocks leave a row of output tiles unfinished: they are held, per band written.
    assert block_cache_bytes(256, 3 * COG_BLOCK_PX, out_bands=1) == MIN_BLOCK_CACHE_BYTES
    row_of_tiles = 12 * COG_BLOCK_PX**2  # 12 tiles across 6,000 px
    both = block_cache_bytes(256, 6_000, out_bands=1 + 5)
    assert both == 4 * (256 + 2 * SOURCE_TILE_PX) ** 2 + 6 * row_of_tiles
    # Between the floor and GDAL_CACHE_BYTES, however wide the grid or large the block.
    assert block_cache_bytes(256, 10**6, out_bands=6) == GDAL_CACHE_BYTES == 64 * mib
    assert block_cache_bytes(16, 100, out_bands=1) == MIN_BLOCK_CACHE_BYTES == 8 * mib


# Runs in a child: two threads one after the other allocate and free 48 MiB in 4 MiB buffers,
# as the pipeline's reader, model and writer threads do with a block's arrays.
_ARENA_CHILD = r"""
import ctypes, ctypes.util, json, sys, threading
from landcover.prediction.setup import FreedMemory

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

FreedMemory().reuse()
if sys.argv[1] == "arenas":  # the control: glibc's usual arena per thread (up to 8 here)
    ctypes.CDLL(ctypes.util.find_library("c")).mallopt(-8, 8)
go = [threading.Event(), threading.Event()]
done = [threading.Event(), threading.Event()]

def stage(k):
    go[k].wait()
    held = [bytearray(4 * 2**20) for _ in range(12)]
    del held
    done[k].set()

before = rss_mib()
threads = [threading.Thread(target=stage, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
for k in range(2):
    go[k].set()
    done[k].wait()
for t in threads:
    t.join()
print(json.dumps({"retained_mib": rss_mib() - before}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_threads_reuse_one_heap_so_memory_is_the_peak_of_the_sum_not_the_sum_of_peaks() -> None:
    """With an arena per thread each thread's freed buffers stay in its own heap: the process
    keeps the sum of the threads' peaks. `reuse()` keeps one heap for all threads."""

    def retained(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", _ARENA_CHILD, mode], capture_output=True, text=True, check=True
        )
        return float(json.loads(done.stdout)["retained_mib"])

    one_heap, per_thread = retained("one"), retained("arenas")
    assert one_heap < 72  # one thread's 48 MiB, reused by the next
    assert per_thread > 84  # the control: both threads' 48 MiB
