"""What a prediction's model runs on: the CPU's features (`cpu`), torch-free; the ONNX files
exported once from model files and cached by their digest (`onnxcache`), their sessions
(`onnxmodel`, checked by `onnxgraph`) and what the outputs record of them (`inference`); the
int8 models quantized once from those exports (`quantize`) on a chip store's sample
(`calibration`). The loader that picks a backend and a precision is
`landcover.prediction.runtime`.

This package imports only its torch-free modules (`cpu`, `inference`), so that readers of a
map's tags (`landcover.prediction.stacitem`) and the `--nproc` parent do not import torch; the
others are imported by module name.
"""

from __future__ import annotations

from landcover.prediction.backends.cpu import CpuFeatures, cpu_features
from landcover.prediction.backends.inference import Inference, QuantizedInference

__all__ = ["CpuFeatures", "Inference", "QuantizedInference", "cpu_features"]
