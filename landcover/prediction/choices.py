"""The choices of `predict --runtime` and `--tta`, torch-free so that the CLI's options and the
library's checks read the same names without `landcover predict --help` importing torch."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["RUNTIMES", "TTA_MODES", "TTA_OPS"]

# what runs the model: auto picks onnxruntime for *.onnx (landcover.prediction.runtime)
RUNTIMES: tuple[str, ...] = ("auto", "torch", "onnxruntime")

# `landcover.data.augment.dihedral` ops averaged by each TTA mode (landcover.prediction.tta):
# the identity; the flip subgroup (identity, left-right, up-down, both); the whole group
TTA_OPS: Mapping[str, tuple[int, ...]] = {
    "none": (0,),
    "flips": (0, 1, 2, 3),
    "d4": tuple(range(8)),
}
TTA_MODES: tuple[str, ...] = tuple(TTA_OPS)
