"""Inputs of the prediction tests: tiny GeoTIFFs with a fixed seed and tiny model files; and
the pipeline threads a test expects to be gone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import ColorInterp

from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from landcover.prediction.region import Region, parse_bbox
from tiling.sources.classes import get_class_map

UTM18 = "EPSG:32618"
ORIGIN = (500_000.0, 4_000_000.0)
CHIP = 32
CLASS_MAP = get_class_map("chesapeake7to5")  # 5 codes: nodata + 4 classes


def pixels(height: int, width: int, *, seed: int) -> npt.NDArray[np.uint8]:
    """Blocky random imagery in 1..255 (0 stays free for nodata)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(1, 256, size=(4, height // 6 + 2, width // 6 + 2))
    up = np.repeat(np.repeat(coarse, 6, axis=1), 6, axis=2)[:, :height, :width]
    noise = rng.integers(-10, 11, size=(4, height, width))
    out: npt.NDArray[np.uint8] = np.clip(up + noise, 1, 255).astype(np.uint8)
    return out


def write_image(
    path: Path,
    data: npt.NDArray[np.uint8],
    *,
    crs: str = UTM18,
    transform: Affine | None = None,
    nodata: float | None = None,
    nir_as_alpha: bool = False,
) -> Path:
    count, height, width = data.shape
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        height=height,
        width=width,
        count=count,
        dtype=data.dtype.name,
        crs=CRS.from_user_input(crs),
        transform=transform or Affine(1.0, 0.0, ORIGIN[0], 0.0, -1.0, ORIGIN[1]),
        nodata=nodata,
    ) as dst:
        dst.write(data)
        if nir_as_alpha:
            dst.colorinterp = [
                ColorInterp.red,
                ColorInterp.green,
                ColorInterp.blue,
                ColorInterp.alpha,
            ]
    return path


def write_model(
    path: Path,
    *,
    constant_class: int | None = None,
    resolution_m: float = 1.0,
    in_channels: int = 4,
    class_map: Any = CLASS_MAP,
    seed: int = 0,
) -> Path:
    """A small_unet model file; `constant_class` makes every logit map constant (argmax = it)."""
    torch.manual_seed(seed)
    model = build_model("small_unet", in_channels=in_channels, num_classes=class_map.num_classes)
    if constant_class is not None:
        head: Any = model.head
        with torch.no_grad():
            head.weight.zero_()
            bias = torch.linspace(0.0, 1.0, class_map.num_classes)
            bias[constant_class] = 5.0
            head.bias.copy_(bias)
    bands = ("red", "green", "blue", "nir", "swir")[:in_channels]
    meta = ModelMeta(
        architecture="small_unet",
        class_map=class_map,
        band_names=bands,
        band_mean=(110.0,) * in_channels,
        band_std=(60.0,) * in_channels,
        chip_size=CHIP,
        resolution_m=resolution_m,
    )
    save_model_file(path, model, meta)
    return path


def read(path: Path) -> tuple[npt.NDArray[Any], Any]:
    with rasterio.open(path) as ds:
        return ds.read(), ds.profile


def utm_region(minx: float, miny: float, maxx: float, maxy: float) -> Region:
    return parse_bbox(f"{minx},{miny},{maxx},{maxy}", crs=UTM18)


def pipeline_threads() -> list[str]:
    """Names of the prediction pipeline's reader and writer threads still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith("predict-")]
