"""Memory of a tiled product (landcover.prediction.tiled) does not grow with the number of
tiles a process writes: a tile's image handles, its GDAL buffers and its record are let go
once the tile is committed.

The image is tiled in blocks of `BLOCK_PX` (as NAIP's COGs are), so each open handle holds a
decoded block of `BLOCK_BYTES`; the model is replaced by zeros, so the test runs the
product's reading and writing, not the network.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import rasterio
import torch
from affine import Affine

from landcover.prediction import tiled
from landcover.prediction.config import PredictConfig
from landcover.prediction.tileplan import TiledSetup
from landcover.prediction.windows import WindowRunner
from tests.landcover.prediction.inputs import ORIGIN, UTM18, pixels, write_model

BLOCK_PX = 512
BLOCK_BYTES = 4 * BLOCK_PX * BLOCK_PX  # one decoded block of the image's four bands
IMAGE_PX = 150  # 10 x 10 tiles of 16 px
TILE_PX = 16
FIRST_MEASURED_TILE = 30  # after the heap's and GDAL's first allocations

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self for RSS and open files"
)


def rss_bytes() -> int:
    """This process's resident memory, after the heap hands its free pages back (prediction
    keeps freed memory for reuse: the test measures what is held, not what is cached)."""
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_handles(path: Path) -> int:
    """How many file descriptors of this process are open on `path`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since the listing
            continue
    return count


def write_blocked_image(path: Path) -> Path:
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        height=IMAGE_PX,
        width=IMAGE_PX,
        count=4,
        dtype="uint8",
        crs=UTM18,
        transform=Affine(1.0, 0.0, ORIGIN[0], 0.0, -1.0, ORIGIN[1]),
        tiled=True,
        blockxsize=BLOCK_PX,
        blockysize=BLOCK_PX,
        compress="deflate",
    ) as dst:
        dst.write(pixels(IMAGE_PX, IMAGE_PX, seed=3))
    return path


def test_memory_and_open_images_stay_flat_over_the_tiles_a_process_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = write_blocked_image(tmp_path / "blocked.tif")
    model = write_model(tmp_path / "model.pt", seed=7)

    def zeros(self: WindowRunner, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros((x.shape[0], self.num_classes, *x.shape[-2:]))

    monkeypatch.setattr(WindowRunner, "_model_pass", zeros)
    after_tile: list[tuple[int, int]] = []  # (RSS, open handles on the image) after each tile
    predict_tile = tiled._predict_tile

    def measured(*args: Any, **kwargs: Any) -> Any:
        result = predict_tile(*args, **kwargs)
        after_tile.append((rss_bytes(), open_handles(image)))
        return result

    monkeypatch.setattr(tiled, "_predict_tile", measured)
    config = PredictConfig(str(model), (str(image),), f"{tmp_path / 'tiles'}/", device="cpu")
    result = tiled.predict_product(TiledSetup(config, TILE_PX))
    assert result.predicted == len(after_tile) == (-(-IMAGE_PX // TILE_PX)) ** 2
    handles = [h for _, h in after_tile]
    assert max(handles) <= handles[0]  # the tiles before are closed, not kept
    first, last = after_tile[FIRST_MEASURED_TILE][0], after_tile[-1][0]
    per_tile = (last - first) / (len(after_tile) - 1 - FIRST_MEASURED_TILE)
    # An image handle kept per tile costs at least its decoded block.
    assert per_tile < BLOCK_BYTES / 4, f"{per_tile / 2**10:.0f} KiB more RSS per tile"
