"""The choices and defaults of `predict`'s options (--backend, --precision, --tta, --max-pixels, the
--resolution factors), free of torch and GDAL so that the CLI's options and the library's
checks read the same values without `landcover predict --help` (or the `--nproc` parent)
importing them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

__all__ = [
    "AUTO_ONNX_MIN_WINDOW_PIXELS",
    "BACKENDS",
    "BLOCK_AUTO_CPU_BYTES",
    "BLOCK_AUTO_DEVICE_PX",
    "BLOCK_AUTO_MAX_PX",
    "CALIBRATION_BATCH",
    "CALIBRATION_CHIPS",
    "CARRY_BELOW_BYTES",
    "DEFAULT_MAX_PIXELS",
    "ONNX_CPU_BATCH_PIXELS",
    "PRECISIONS",
    "RESOLUTION_LIMIT_FACTOR",
    "RESOLUTION_WARN_FACTOR",
    "TTA_MODES",
    "TTA_OPS",
    "WINDOW_AUTO_MAX_CHIPS",
    "WINDOW_CHOICES",
    "WINDOW_MULTIPLE_PX",
    "WINDOW_OVERLAP_MARGIN_PX",
    "WINDOW_OVERLAP_PX",
    "WINDOW_SMP_OVERLAP_PX",
    "Backend",
    "Precision",
    "TtaMode",
    "int8_choice_problem",
    "overlap_choice_problem",
    "window_choice_problem",
]

# What runs the model (landcover.prediction.runtime): auto picks onnxruntime for a large
# enough prediction on the CPU where it is installed (bench_predict.py measures it against
# torch), torch elsewhere; *.onnx files always run with onnxruntime.
Backend = Literal["auto", "torch", "onnxruntime"]
BACKENDS: tuple[str, ...] = get_args(Backend)

# The numbers the model computes in (landcover.prediction.runtime): auto is fp32 until a
# benchmark shows a reduced precision agrees with it (bench_predict.py). int8 is onnxruntime's
# static quantization of the model's ONNX export (landcover.prediction.backends.quantize).
Precision = Literal["auto", "fp32", "bf16", "int8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

# `--precision int8` calibrates the activations' ranges on this many train chips of the
# `--calibration` store, evenly spaced in store order (landcover.prediction.backends.calibration):
# a fixed sample, so every rank and task quantizes the same bits, from all of the store's
# sources rather than the first one's corner. onnxruntime holds the activations of one batch of
# CALIBRATION_BATCH chips at a time (an smp U-Net on resnet18: about 100 MB a 256 px chip).
CALIBRATION_CHIPS = 32
CALIBRATION_BATCH = 4

# `--backend auto` exports a model.pt to ONNX only for a prediction whose windows hold at least
# this many pixels (about 61 windows of 256 px): the export takes seconds to a minute once,
# and onnxruntime's lead over torch eager repays it from a few million window pixels on
# (bench_predict.py --only backends prints both). Smaller predictions (a test scene, a quick
# look) run torch.
AUTO_ONNX_MIN_WINDOW_PIXELS = 4_000_000

# onnxruntime on the CPU runs at most this many window pixels a batch (4 windows of 256 px):
# its kernels give the same bits at any batch, it takes as long a pixel from 4 windows a batch
# to 16, and the activations of a batch are most of a prediction's memory (an smp U-Net on
# resnet18: about 100 MB a 256 px window; peak RSS 1.07 GB at 4 windows, 1.68 GB at 16).
ONNX_CPU_BATCH_PIXELS = 4 * 256 * 256

# `--block-px auto` (landcover.prediction.blocks.resolve_block_px). On the CPU a block's own
# arrays (the blended sums and weights, the logits of its windows, the class and probability
# planes: `block_bytes_per_px`) live in the process beside the model's activations: the edge is
# the largest multiple of the output's COG tile whose arrays fit in BLOCK_AUTO_CPU_BYTES, up to
# BLOCK_AUTO_MAX_PX. Peak RSS then stops growing with the region once the region is a block
# wide (a 2,048 px block held about 4 times these bytes and peaked 1.4x higher on a 4,096 px
# scene than on a 1,024 px one). Windows on the boundary between two block rows run once for
# each, so a smaller edge costs time. On a GPU the block's arrays live in device memory: the
# edge is BLOCK_AUTO_DEVICE_PX.
BLOCK_AUTO_CPU_BYTES = 160 * 1024 * 1024
BLOCK_AUTO_MAX_PX = 2048
BLOCK_AUTO_DEVICE_PX = 2048

# The logits kept for the next block row (landcover.prediction.carry): the windows that reach
# across the bottom edge of a block row, cut to the rows below it, so that they are not run
# again for the blocks of the next row (a window of 512 px with 128 px of overlap over blocks
# of 1,024 px ran a third more windows than the layout holds). The bytes grow with the width
# of the area, up to this budget; windows past it run again, so memory stays flat however
# wide the area (a 4,096 px wide grid of 6 classes keeps about 30 to 50 MB).
CARRY_BELOW_BYTES = 32 * 1024 * 1024

# The model's window (`--window`, landcover.prediction.windows.choose_window_px): the model's
# chip, `auto`, or an edge in px. Every model of the registry is fully convolutional and takes
# any multiple of its stride (8 px for small_unet, 32 for the ResNet U-Nets): an explicit edge
# must be a multiple of 32. `auto` takes windows of up to WINDOW_AUTO_MAX_CHIPS chips a side
# (a 256 px chip: up to 1,024 px, where the default 64 px overlap is 12 % of a window's pixels
# instead of 44 %), no larger than a quarter of the block edge: the windows on the boundary
# between two block rows run once for each, and that share grows with the window.
WINDOW_CHOICES: tuple[str, ...] = ("chip", "auto")
WINDOW_MULTIPLE_PX = 32
WINDOW_AUTO_MAX_CHIPS = 4

# The overlap of neighbouring windows (`--overlap`, landcover.prediction.windows.
# choose_overlap_px): `auto` or px. A window's logits are wrong near its edges, where the model
# sees padding instead of the scene, and the deeper the model the further in: `auto` overlaps
# windows by what the architecture needs for its class map to agree with whole-image
# inference on >= 0.999 of the pixels within 16 px of window edges, measured by
# bench_windows.py on synthetic and real scenes (docs/benchmarks/predict.md): 8 output strides
# of small_unet (64 px: 32 fell to 0.997 on real NAIP), 4 of a ResNet U-Net (128 px). An smp
# model (`smp:ARCH:ENCODER`) takes WINDOW_SMP_OVERLAP_PX, an architecture not recorded here a
# quarter of its chip. Where the window is too small for that (torch on the CPU runs the
# chip), `auto` takes half the window less WINDOW_OVERLAP_MARGIN_PX.
WINDOW_OVERLAP_PX: Mapping[str, int] = {
    "small_unet": 64,
    "unet_resnet18": 128,
    "unet_resnet34": 128,
    "unet_resnet50": 128,
}
WINDOW_SMP_OVERLAP_PX = 128  # smp's encoders at their default depth of 5: a ResNet U-Net's
WINDOW_OVERLAP_MARGIN_PX = 8

# `landcover.data.augment.dihedral` ops averaged by each TTA mode (landcover.prediction.tta):
# the identity; the flip subgroup (identity, left-right, up-down, both); the whole group
TtaMode = Literal["none", "flips", "d4"]
TTA_OPS: Mapping[str, tuple[int, ...]] = {
    "none": (0,),
    "flips": (0, 1, 2, 3),
    "d4": tuple(range(8)),
}
TTA_MODES: tuple[str, ...] = get_args(TtaMode)  # the keys of TTA_OPS

# Output grids above this many pixels are refused unless the caller raises the limit: 10
# gigapixels is 100 x 100 km at 1 m (a 10 GB uint8 map before compression, hours of
# inference); a --resolution typo such as 0.0001 m asks for 10^8 times the image's pixels.
DEFAULT_MAX_PIXELS = 10_000_000_000

# A model sees objects at the scale of the pixels it was trained on (training augments flips
# and rotations, never scale): a --resolution more than RESOLUTION_LIMIT_FACTOR times coarser
# or finer than the model's is refused (a 1 m model on 300 m pixels maps noise), one more than
# RESOLUTION_WARN_FACTOR times off is warned about (a 1 m model on 0.6 m NAIP or 2 m pixels).
RESOLUTION_WARN_FACTOR = 1.5
RESOLUTION_LIMIT_FACTOR = 4.0


def window_choice_problem(window: str) -> str | None:
    """What is wrong with a `--window` value (None: nothing): chip, auto, or a positive
    multiple of WINDOW_MULTIPLE_PX px."""
    if window in WINDOW_CHOICES:
        return None
    if not window.isdigit() or int(window) < 1:
        return f"--window {window!r}: give chip, auto or an edge in px"
    if int(window) % WINDOW_MULTIPLE_PX:
        nearest = max(1, round(int(window) / WINDOW_MULTIPLE_PX)) * WINDOW_MULTIPLE_PX
        return (
            f"--window {window}: the edge must be a multiple of {WINDOW_MULTIPLE_PX} px (the "
            f"models' stride), e.g. {nearest}"
        )
    return None


def overlap_choice_problem(overlap_px: int | None) -> str | None:
    """What is wrong with an `--overlap` value (None: nothing; None is `auto`)."""
    if overlap_px is not None and overlap_px < 0:
        return f"--overlap {overlap_px}: give auto or an overlap of 0 px or more"
    return None


def int8_choice_problem(
    *, backend: str, precision: str, calibration: str | None, adapting: bool
) -> str | None:
    """What is wrong with `--precision int8`'s company (None: nothing): it runs on onnxruntime
    only, `--calibration` names a store and calibrates int8 only, and a model adapted at run
    time (`--adapt`) would need its own calibration."""
    if calibration is not None and not calibration.strip():
        return (
            f"--calibration {calibration!r}: give a chip store's path or URL (from `landcover "
            "tile`), or drop --calibration"
        )
    if precision != "int8":
        if calibration is not None:
            return (
                f"--calibration {calibration}: calibrates --precision int8 only (this run is "
                f"--precision {precision}); drop --calibration or add --precision int8"
            )
        return None
    if backend == "torch":
        return (
            "--precision int8 --backend torch: int8 runs on onnxruntime's static quantization "
            "only; use --backend onnxruntime (or auto)"
        )
    if adapting:
        return (
            "--precision int8 with --adapt: the int8 model is calibrated for the model's own "
            "statistics, not adapted ones; use --adapt none, or --precision fp32"
        )
    return None
