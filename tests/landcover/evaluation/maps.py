"""Tiny prediction and truth rasters with hand-computed scores, shared by the evaluation tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
from affine import Affine
from click.testing import CliRunner

from landcover import cli
from landcover.prediction.outgrid import TAG_CLASS_MAP
from tiling.sources.classes import get_class_map

UTM = "EPSG:32618"
X0, Y0 = 400_000.0, 4_100_000.0
FIVE = get_class_map("chesapeake7to5")

# Prediction codes (0 = nodata) and Chesapeake raw truth (5, 6 → 4; 15 = nodata → 0).
PRED = np.array(
    [
        [1, 1, 2, 2, 0],
        [1, 1, 2, 3, 3],
        [4, 4, 2, 3, 3],
        [4, 1, 2, 3, 3],
    ],
    dtype=np.uint8,
)
TRUTH_RAW = np.array(
    [
        [1, 1, 2, 2, 2],
        [1, 2, 2, 3, 3],
        [5, 6, 2, 3, 15],
        [4, 1, 1, 3, 3],
    ],
    dtype=np.uint8,
)
# By hand, truth rows x predicted columns over the 18 pixels both label.
CONFUSION = [[4, 1, 0, 0], [1, 4, 0, 0], [0, 0, 5, 0], [0, 0, 0, 3]]


def write(
    path: Path,
    data: npt.NDArray[np.uint8],
    *,
    res: float = 1.0,
    x0: float = X0,
    y0: float = Y0,
    crs: str = UTM,
    nodata: float | None = None,
    tags: dict[str, str] | None = None,
) -> Path:
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=data.shape[1],
        height=data.shape[0],
        count=1,
        dtype="uint8",
        crs=crs,
        transform=Affine(res, 0, x0, 0, -res, y0),
        nodata=nodata,
    ) as dst:
        dst.write(data, 1)
        if tags:
            dst.update_tags(**tags)
    return path


def write_prediction(path: Path, data: npt.NDArray[np.uint8] = PRED) -> Path:
    tags = {TAG_CLASS_MAP: json.dumps(FIVE.to_json())}
    return write(path, data, nodata=0, tags=tags)


def run(*args: str) -> Any:
    return CliRunner().invoke(cli.main, ["evaluate", *args])
