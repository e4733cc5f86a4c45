"""What a prediction sets up and checks before it reads a pixel: the process (warnings,
malloc), the device, the images, and the model against those images.

Every check here is cheap and runs before the long work, so bad input fails in seconds with
one line naming the value and the fix.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from rasterio.errors import NotGeoreferencedWarning

from landcover.data.normalise import check_band_stats
from landcover.errors import PredictionError
from landcover.models.modelfile import ModelMeta
from landcover.warnlog import warnings_logged
from tiling.sources import RasterInfo, expand_inputs, open_image

logger = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def warnings_to_log() -> AbstractContextManager[None]:
    """Python warnings raised while predicting become one log line each (WARNING). rasterio's
    warning on an image without a geotransform is dropped: open_image then raises its own
    error naming the file and the fix."""
    return warnings_logged(logger, ignore=(NotGeoreferencedWarning,))


def keep_large_buffers_off_the_heap() -> None:
    """Serve allocations over 1 MiB with mmap, so freed block buffers go back to the OS.

    glibc raises its mmap threshold each time a large block is freed, after which the
    per-block tensors and arrays come from the heap, fragment it, and RSS creeps up with the
    number of blocks (measured: +25% over 64 blocks). Fixing the threshold keeps it flat.
    Process-wide and idempotent; a no-op where there is no glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, 1024 * 1024)
    except (OSError, AttributeError):
        return


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


def resolve_device(text: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`, `mps` or `auto` (CUDA when there is one)."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise PredictionError(
            f"--device {text!r} is not a device; use cpu, cuda, cuda:0 or auto"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PredictionError(f"--device {text}: no CUDA device here; use --device cpu")
    if (
        device.type == "cuda"
        and device.index is not None
        and device.index >= torch.cuda.device_count()
    ):
        raise PredictionError(
            f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) here"
        )
    return device


def rank_device(text: str, local_rank: int) -> str:
    """The --device of one rank of a job: `auto` or `cuda` become the rank's own GPU
    (`cuda:<local rank mod GPUs>`) when there are GPUs; anything else stays as given."""
    if text in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local_rank % torch.cuda.device_count()}"
    return text


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
