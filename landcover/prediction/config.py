"""`PredictConfig`: everything a prediction needs, and the one definition of the options of
`landcover predict` that the library reads.

Each field that is an option declares its flag and help (`tiling.runtime.flags.option`); the
command generates those click options from it (`PREDICT_OPTIONS`), adding only what is the
command's own (output-URL callbacks, the narrower click types), and builds the config from the
parsed values. The values the library cannot use are refused once, here, in the constructor
(one line naming the option). Free of torch and GDAL, so that `landcover predict --help` and
the `--nproc` parent do not import them; the region is parsed by the command
(`landcover.prediction.region`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from landcover.cliconfig import OptionSpec, option_specs
from landcover.errors import PredictionError
from landcover.prediction.adaptspec import ADAPT_METHODS, DEFAULT_ADAPT, parse_adapt
from landcover.prediction.choices import (
    AUTO_ONNX_MIN_WINDOW_PIXELS,
    BLOCK_AUTO_CPU_BYTES,
    BLOCK_AUTO_DEVICE_PX,
    DEFAULT_MAX_PIXELS,
    RESOLUTION_LIMIT_FACTOR,
    RESOLUTION_WARN_FACTOR,
    Backend,
    Precision,
    TtaMode,
    int8_choice_problem,
    overlap_choice_problem,
    window_choice_problem,
)
from landcover.prediction.tilesize import check_tile_size
from tiling.runtime.flags import flag, option

if TYPE_CHECKING:
    from landcover.prediction.region import Region

__all__ = ["MIN_BLOCK_PX", "PREDICT_OPTIONS", "PredictConfig"]

MIN_BLOCK_PX = 16


@dataclass(frozen=True, slots=True)
class PredictConfig:
    """Everything `predict_region` needs; built by the CLI (or `landcover.api.predict`)."""

    model: str = field(metadata=flag("MODEL"))
    images: tuple[str, ...]  # IMAGES, resolved (globs, STAC items) by the command
    out: str = field(
        metadata=flag(
            "--out",
            "Output land-cover COG: a local path or an az:// URL; a directory (DIR/, with the "
            "slash) for a tiled map product with --tile-size.",
        )
    )
    region: Region | None = None  # None: the union of the images
    dst_crs: str | None = option("--dst-crs", None, "Output CRS [default: the first image's].")
    # in units of the output CRS; None: the model's
    resolution: float | None = option(
        "--resolution",
        None,
        "Output pixel size in --dst-crs units [default: the model's resolution]. More than "
        f"{RESOLUTION_LIMIT_FACTOR:g}x coarser or finer than the model's is refused, more than "
        f"{RESOLUTION_WARN_FACTOR:g}x warned about (the model sees objects at another scale "
        "than it learnt); grids above --max-pixels are refused.",
    )
    # None: auto (landcover.prediction.windows.choose_overlap_px); the value is checked here
    overlap_px: int | None = option(
        "--overlap",
        None,
        "Window overlap, blended smoothly: auto (what the model's architecture needs for a "
        "seamless map: 64 px for small_unet, 128 px for the ResNet U-Nets and smp models, a "
        "quarter of the chip for others; at most half the window less 8 px) or px (at "
        "most half the window).",
    )
    # landcover.prediction.windows.choose_window_px; the value is checked here
    window: str = option(
        "--window",
        "auto",
        "Model window edge: auto (with onnxruntime or on a GPU, windows of up to 4 chips a "
        "side and a quarter of --block-px, and with onnxruntime on the CPU no more pixels "
        "than one batch: the overlap costs fewer pixels; the chip where torch runs on the "
        "CPU), chip (the model's chip), or an edge in px (a multiple of 32).",
    )
    batch_size: int = option(
        "--batch-size",
        16,
        "Windows per batch (of the model's chip: larger windows take as many pixels).",
    )
    device: str = option("--device", "cpu", "auto, cpu, cuda, cuda:N.")
    # what runs the model (landcover.prediction.runtime); checked where it loads
    backend: Backend = option(
        "--backend",
        "auto",
        "What runs MODEL: torch (model.pt, TorchScript) or onnxruntime (an ONNX file, or a "
        "model.pt exported once to ONNX and cached by its digest). auto: onnxruntime for "
        "*.onnx; for a model.pt on the CPU, onnxruntime where it is installed and the "
        f"windows hold at least {AUTO_ONNX_MIN_WINDOW_PIXELS / 1e6:g} million pixels (the "
        "one-time export pays off), else torch. "
        "The output's LANDCOVER_BACKEND tag says what ran.",
        deprecated=("--runtime",),
    )
    precision: Precision = option(
        "--precision",
        "auto",
        "Numbers the model computes in: fp32, bf16 (torch autocast, on CPUs with AVX-512 "
        "BF16 or AMX and on CUDA GPUs with bf16; refused elsewhere), or int8 (onnxruntime's "
        "static quantization, calibrated on --calibration chips, on CPUs with AVX-512 VNNI or "
        "AVX-VNNI); auto is fp32. The output's LANDCOVER_PRECISION tag says what ran.",
    )
    # landcover.prediction.backends.calibration; once the sample is read, STORE@DIGEST
    calibration: str | None = option(
        "--calibration",
        None,
        "With --precision int8: the chip store (from `landcover tile`) whose train chips "
        "calibrate the quantized model [default: the model's training store, where it can be "
        "read]. The output's LANDCOVER_CALIBRATION tags record the store and the sample's "
        "SHA-256.",
    )
    # landcover.prediction.tta; checked before the model loads
    tta: TtaMode = option(
        "--tta",
        "none",
        "Test-time augmentation: average the logits over the 8 flips/rotations of the "
        "square (--tta or --tta d4, 8x the model time) or the 4 flips (--tta flips, 4x).",
    )
    # landcover.prediction.adapt; once its statistics are computed, METHOD:STRENGTH@DIGEST
    adapt: str = option(
        "--adapt",
        DEFAULT_ADAPT,
        "Test-time adaptation to the images, from statistics computed once per run on a fixed "
        f"lattice of windows: {', '.join(ADAPT_METHODS)}. bands: the images' band means and "
        "stds replace the training ones; bn: BatchNorm statistics re-estimated on the images "
        "(bn-early: the first 2 layers only); bn+bands: both. METHOD:S mixes the images' "
        "statistics with the training ones at strength S in [0, 1] (e.g. bn:0.5). The "
        "output's LANDCOVER_ADAPT tags record the method and the statistics' SHA-256.",
    )
    probabilities: str | None = option(
        "--probabilities",
        None,
        "Also write per-class probabilities (uint8, scale 1/254, 255 = nodata) as a COG.",
    )
    overwrite: bool = False
    # None: auto, resolved once by prepare_prediction (landcover.prediction.blocks.resolve_block_px)
    block_px: int | None = option(
        "--block-px",
        None,
        "Output block edge in px [default: auto: on the CPU, the largest multiple of 512 px "
        "up to 2048 whose blended logits fit in "
        f"{BLOCK_AUTO_CPU_BYTES // 2**20} MiB (fewer classes and less window overlap: "
        f"larger blocks); on a GPU, {BLOCK_AUTO_DEVICE_PX}]. Memory grows with the block's "
        "square, not with the region; windows on the boundary between two block rows run "
        "once for each, so a smaller block costs time.",
        deprecated=("--block-size",),
    )
    # the tiled map product's tile edge (landcover.prediction.tilesize); None: one COG
    tile_px: int | None = option(
        "--tile-size",
        None,
        "With --out DIR/ (a trailing slash or a directory): write a tiled map product, one "
        "COG per PX x PX tile (named E{x}_N{y} by its upper-left map corner), a STAC "
        "collection.json and mosaic.vrt; a rerun redoes only missing or changed tiles.",
    )
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag("--storage-options")
    )
    progress: bool | None = None  # None: a progress bar when stderr is a terminal
    max_pixels: int | None = option(  # refuse larger output grids; None: no limit
        "--max-pixels",
        DEFAULT_MAX_PIXELS,
        f"Refuse an output grid with more pixels than this ({DEFAULT_MAX_PIXELS / 1e9:g} "
        f"gigapixels: {DEFAULT_MAX_PIXELS**0.5 / 1000:g} x {DEFAULT_MAX_PIXELS**0.5 / 1000:g} "
        "km at 1 m), before any work: a --resolution typo would otherwise fill the disk. Raise "
        "it for larger regions.",
    )
    # Images without nodata or a mask: pixels 0 in every band are nodata (NAIP collars).
    zero_is_nodata: bool = option(
        "--zero-nodata",
        True,
        "In images that declare no nodata and have no mask, pixels 0 in all bands are "
        "nodata (the black collar of reprojected NAIP). --no-zero-nodata keeps them as data.",
        off="--no-zero-nodata",
    )
    # Read, infer and write in three overlapping threads; False: one block after another in
    # this thread (the same bytes, slower: for comparisons and debugging).
    pipeline: bool = True

    def __post_init__(self) -> None:
        window_problem = window_choice_problem(self.window)
        if window_problem is not None:
            raise PredictionError(window_problem)
        overlap_problem = overlap_choice_problem(self.overlap_px)
        if overlap_problem is not None:
            raise PredictionError(overlap_problem)
        if self.batch_size < 1:
            raise PredictionError(f"--batch-size {self.batch_size}: must be at least 1")
        if self.block_px is not None and self.block_px < MIN_BLOCK_PX:
            raise PredictionError(f"--block-px {self.block_px} px: must be at least {MIN_BLOCK_PX}")
        adapting = parse_adapt(self.adapt).active  # one line naming a bad --adapt
        int8_problem = int8_choice_problem(
            backend=self.backend,
            precision=self.precision,
            calibration=self.calibration,
            adapting=adapting,
        )
        if int8_problem is not None:
            raise PredictionError(int8_problem)
        if self.tile_px is not None:  # the one check of the tile size
            check_tile_size(self.tile_px, self.out, self.max_pixels)
            if self.probabilities is not None:
                raise PredictionError(
                    f"--probabilities {self.probabilities}: a tiled product holds class tiles "
                    "only; drop --probabilities"
                )

    @property
    def resolved_block_px(self) -> int:
        """The block edge in px once `prepare_prediction` has resolved `auto` (None)."""
        if self.block_px is None:  # a bug: every prediction is prepared first
            raise RuntimeError("--block-px auto is resolved by prepare_prediction")
        return self.block_px


# The fields that are options of `landcover predict`, by name.
PREDICT_OPTIONS: Mapping[str, OptionSpec] = {o.name: o for o in option_specs(PredictConfig)}
