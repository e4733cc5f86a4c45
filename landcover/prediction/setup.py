"""What a prediction sets up and checks before it reads a pixel: the process (warnings,
malloc), the images, and the model against those images (the device: `landcover.devices`).

Every check here is cheap and runs before the long work, so bad input fails in seconds with
one line naming the value and the fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from rasterio.errors import NotGeoreferencedWarning

from landcover.data.normalise import check_band_stats
from landcover.errors import PredictionError
from landcover.models.modelfile import ModelMeta
from landcover.prediction.outfiles import COG_BLOCK_PX
from landcover.warnlog import warnings_logged
from tiling.sources.rasters import RasterInfo, expand_inputs, open_image

logger = logging.getLogger(__name__)

# glibc's mallopt parameter numbers
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Allocations up to this size come from the heap: more than any batch's activations.
_HEAP_ALLOCATION_BYTES = 1 << 30

# GDAL's block cache defaults to 5% of RAM and keeps every tile a run reads or writes until it
# is full: cap it so that memory stays flat (`GDAL_CACHE_BYTES` for the COGs' assembly, where
# a larger cache speeds the overviews; `block_cache_bytes` while the blocks are predicted).
GDAL_CACHE_BYTES = 64 * 1024 * 1024
MIN_BLOCK_CACHE_BYTES = 8 * 1024 * 1024
# The tile side assumed for the source images (NAIP's COGs; a smaller tile needs less)
SOURCE_TILE_PX = 512


def warnings_to_log() -> AbstractContextManager[None]:
    """Python warnings raised while predicting become one log line each (WARNING). rasterio's
    warning on an image without a geotransform is dropped: open_image then raises its own
    error naming the file and the fix."""
    return warnings_logged(logger, ignore=(NotGeoreferencedWarning,))


class FreedMemory:
    """Keeps freed memory for reuse from batch to batch; hands it back when RSS creeps.

    `reuse()` makes glibc serve allocations up to 1 GiB from the heap and keep what is freed
    there: a block's arrays and the model's activations then reuse the same pages batch after
    batch (torch's activations are 64-byte aligned, and glibc fits such a request into a freed
    chunk of the same size only where nothing was allocated right after that chunk: in most
    runs, not all; onnxruntime keeps its activations in its own arena). With glibc's
    default (or a 1 MiB mmap threshold) every activation over the threshold is a fresh mmap
    that the kernel zero-fills page by page in every batch, which slows the forward pass
    several times over (`benchmarks/bench_predict.py`). It also gives every thread the one
    heap (glibc's M_ARENA_MAX 1): with a heap per thread (glibc's default) the pipeline's
    reader, model and writer threads each keep the freed pages of their own peak, so the
    process holds the sum of their peaks instead of the peak of their sum, and RSS grows with
    the number of blocks. Call `reuse()` before the model loads and the pipeline's threads
    start (set after it, RSS creeps more).

    `release()`, after each block that ran the model, notes the largest RSS after the first
    `settle_blocks` of them (their pages for batches included) and from then on returns the
    free pages to the OS (malloc_trim) whenever RSS has grown by more than `slack` over it:
    the heap's fragmentation cannot make RSS creep with the number of blocks, and the pages
    of a batch are not faulted in again after every block. The first block alone is not the
    measure: it holds no logits kept from a block before it (`landcover.prediction.carry`),
    so the blocks after it would leave RSS above it and hand back, then fault in again, the
    pages that every block needs.
    Process-wide; no-ops where there is no glibc.
    """

    def __init__(self, *, slack: float = 0.02, settle_blocks: int = 2) -> None:
        self._libc = _glibc()
        self._slack = slack
        self._settle_blocks = settle_blocks
        self._blocks = 0  # `release` calls so far
        self._limit_bytes = 0

    def reuse(self) -> None:
        if self._libc is not None:
            self._libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_ALLOCATION_BYTES)
            self._libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_ALLOCATION_BYTES)
            self._libc.mallopt(_M_ARENA_MAX, 1)

    def hand_back(self) -> None:
        """Return the heap's free pages to the OS now (malloc_trim): after a large object is
        dropped before the pipeline starts (a torch model that onnxruntime replaces), whose
        pages the heap would otherwise keep, scattered between live ones."""
        if self._libc is not None:
            self._libc.malloc_trim(0)

    def release(self) -> None:
        if self._libc is None:
            return
        rss = _rss_bytes()
        self._blocks += 1
        if self._blocks <= self._settle_blocks:
            self._limit_bytes = max(self._limit_bytes, int(rss * (1 + self._slack)))
        elif rss > self._limit_bytes:
            self._libc.malloc_trim(0)


def block_cache_bytes(block_px: int, width: int, out_bands: int, *, in_bands: int = 4) -> int:
    """GDAL's block cache while the blocks of a `width` px wide grid are predicted: what the
    access pattern reuses, between MIN_BLOCK_CACHE_BYTES and GDAL_CACHE_BYTES.

    - The source tiles under one block's window (a tile's margin on each side for the halo
      and the alignment): the next block of the row reads the tiles they share again.
    - Where `block_px` is not a multiple of the output's COG_BLOCK_PX tiles, the output tiles
      a block row leaves unfinished (one row of them across the grid, `out_bands` bytes a
      pixel): one evicted would be compressed, read back and written again.

    Anything more holds tiles no block reads again: a fixed 64 MiB cache would hold every
    source tile of a small region and fill up on a larger one, so RSS would rise with the
    region by up to those 64 MiB.
    """
    window = block_px + 2 * SOURCE_TILE_PX
    need = in_bands * window * window
    if block_px % COG_BLOCK_PX:
        tiles_across = -(-width // COG_BLOCK_PX)
        need += out_bands * tiles_across * COG_BLOCK_PX * COG_BLOCK_PX
    return min(max(need, MIN_BLOCK_CACHE_BYTES), GDAL_CACHE_BYTES)


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc() -> Any | None:
    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc has both; musl has neither)
    except (OSError, AttributeError):
        return None
    return libc


def open_images(
    images: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    zero_is_nodata: bool = True,
) -> list[RasterInfo]:
    """Expand paths/globs/URLs and validate each image (4-band uint8, georeferenced).

    `zero_is_nodata`: in images that declare no nodata and have no mask, pixels 0 in every
    band are nodata (the black collar around reprojected NAIP tiles).
    """
    paths = expand_inputs(images, storage_options=storage_options, what="image")
    return [
        open_image(path, storage_options=storage_options, zero_is_nodata=zero_is_nodata)
        for path in paths
    ]


def window_overlap(overlap_px: int | None, chip_size: int) -> int:
    """The overlap of neighbouring windows in px: `overlap_px`, or a quarter of the chip."""
    overlap = chip_size // 4 if overlap_px is None else overlap_px
    if not 0 <= overlap <= chip_size // 2:
        raise PredictionError(
            f"--overlap {overlap}: must be between 0 and {chip_size // 2} px "
            f"(half the model's {chip_size} px window)"
        )
    return overlap


def check_model(where: str, meta: ModelMeta) -> None:
    """A model file's metadata must describe a model that can write a uint8 class map."""
    check_band_stats(
        meta.band_mean,
        meta.band_std,
        bands=meta.in_channels,
        error=PredictionError,
        fix="the model file is damaged, re-export it",
        where=where,
    )
    if not 2 <= meta.num_classes <= 255:
        raise PredictionError(
            f"{where}: class table {meta.class_map.name!r} has {meta.num_classes} codes; a "
            "land-cover raster (uint8, 0 = nodata) holds 2..255"
        )
    if meta.chip_size < 8:
        raise PredictionError(f"{where}: chip size {meta.chip_size} px is too small to predict")


def check_sources_fit(sources: Sequence[RasterInfo], meta: ModelMeta, model: str) -> None:
    """Every image must have the bands the model was trained on."""
    for s in sources:
        if s.count != meta.in_channels:
            raise PredictionError(
                f"{s.path}: has {s.count} bands but model {model} expects {meta.in_channels} "
                f"({', '.join(meta.band_names)}); use images with those bands"
            )
