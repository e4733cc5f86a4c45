"""The model behind a prediction, whatever runs it.

`load_window_model` opens a model for `predict_region` and returns a `WindowModel` (normalised
pixels in, logits out, both torch tensors on the prediction device) with the model's metadata:
- runtime `torch`: a landcover model file (`model.pt`) or a TorchScript file from
  `landcover export --format torchscript`, run by PyTorch;
- runtime `onnxruntime`: an ONNX file from `landcover export --format onnx`, run by
  onnxruntime (CPUExecutionProvider, or CUDAExecutionProvider first for a CUDA device when
  the installed onnxruntime has it). Pixels are normalised by `landcover.data.normalise` on
  torch tensors as for PyTorch, then handed to onnxruntime as numpy arrays;
- `auto`: onnxruntime for *.onnx files, torch for everything else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import fsspec
import torch
from torch import nn

from landcover.errors import ModelFileError, PredictionError
from landcover.models.export import (
    load_torchscript,
    meta_from_onnx_props,
    model_kind,
    require_onnx,
)
from landcover.models.modelfile import ModelMeta, load_model_file
from landcover.prediction.choices import RUNTIMES

logger = logging.getLogger(__name__)


class WindowModel(Protocol):
    """Logits (n, classes, h, w) for normalised pixels (n, bands, h, w), on their device."""

    def __call__(self, pixels: torch.Tensor) -> Any: ...


class TorchWindowModel:
    """An `nn.Module` (a model file's model or a TorchScript module) without autograd."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, pixels: torch.Tensor) -> Any:
        with torch.inference_mode():
            return self.module(pixels)


class OnnxWindowModel:
    """An onnxruntime session; copies pixels to host memory and logits back to their device."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.output_name = session.get_outputs()[0].name

    def __call__(self, pixels: torch.Tensor) -> Any:
        array = pixels.detach().to("cpu", torch.float32).contiguous().numpy()
        (logits,) = self.session.run([self.output_name], {self.input_name: array})
        return torch.from_numpy(logits).to(pixels.device)


def load_window_model(
    url: str,
    *,
    runtime: str = "auto",
    device: torch.device,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[WindowModel, ModelMeta]:
    """The model of `url` run by `runtime` (see the module docstring) and its metadata."""
    if runtime not in RUNTIMES:
        raise PredictionError(f"--runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    kind = model_kind(url, storage_options=storage_options)
    if runtime == "auto":
        runtime = "onnxruntime" if kind == "onnx" else "torch"
    if runtime == "onnxruntime":
        if kind != "onnx":
            raise PredictionError(
                f"--runtime onnxruntime runs ONNX files, not {url}; export it first: "
                f"landcover export {url} --format onnx --out model.onnx"
            )
        return _onnx_model(url, device, storage_options)
    if kind == "onnx":
        raise PredictionError(f"{url} is an ONNX file; use --runtime onnxruntime (or auto)")
    if kind == "torchscript":
        module, meta = load_torchscript(url, device=device, storage_options=storage_options)
    else:
        module, meta = load_model_file(url, device=device, storage_options=storage_options)
    return TorchWindowModel(module), meta


def _onnx_model(
    url: str, device: torch.device, storage_options: Mapping[str, Any] | None
) -> tuple[WindowModel, ModelMeta]:
    ort = require_onnx("onnxruntime")
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            cuda = ("CUDAExecutionProvider", {"device_id": device.index or 0})
            providers.insert(0, cuda)
        else:
            logger.warning(
                "onnxruntime here has no CUDA provider (pip install onnxruntime-gpu); "
                "running the ONNX model on the CPU"
            )
    try:
        with fsspec.open(url, "rb", **dict(storage_options or {})) as f:
            model_bytes = f.read()
    except FileNotFoundError:
        raise ModelFileError(f"{url}: model file not found") from None
    try:
        session = ort.InferenceSession(model_bytes, providers=providers)
    except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidProtobuf
        reason = " ".join(str(exc).split())[:200]
        raise ModelFileError(f"{url}: not a readable ONNX model ({reason})") from None
    meta = meta_from_onnx_props(session.get_modelmeta().custom_metadata_map, url)
    logger.info("running %s with onnxruntime (%s)", url, ", ".join(session.get_providers()))
    return OnnxWindowModel(session), meta
