"""What a prediction's model runs on: the CPU's features (`cpu`), torch-free; the ONNX files
exported once from model files and cached by their digest (`onnxcache`), their sessions
(`onnxmodel`, checked by `onnxgraph`) and what the outputs record of them (`inference`); the
int8 models quantized once from those exports (`quantize`) on a chip store's sample
(`calibration`). The loader
that picks a backend and a precision is `landcover.prediction.runtime`."""

from __future__ import annotations

from landcover.prediction.backends.cpu import CpuFeatures, cpu_features
from landcover.prediction.backends.onnxcache import cached_onnx, onnx_cache_path

__all__ = ["CpuFeatures", "cached_onnx", "cpu_features", "onnx_cache_path"]
