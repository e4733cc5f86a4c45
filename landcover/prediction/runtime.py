"""The model behind a prediction, whatever runs it.

`load_window_model` opens a model for `predict_region` and returns a `WindowModel` (normalised
pixels in, logits out, both torch tensors on the prediction device) with the model's metadata:
- runtime `torch`: a landcover model file (`model.pt`) or a TorchScript file from
  `landcover export --format torchscript`, run by PyTorch;
- runtime `onnxruntime`: an ONNX file from `landcover export --format onnx`, run by
  onnxruntime (CPUExecutionProvider, or CUDAExecutionProvider first for a CUDA device when
  the installed onnxruntime has it). Pixels are normalised by `landcover.data.normalise` on
  torch tensors as for PyTorch, then handed to onnxruntime as numpy arrays. The graph's input
  and output must match the metadata (bands, classes) where its shapes name them;
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
    EXPORT_SOURCE,
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


# On the CPU, PyTorch picks a convolution's kernel by the batch and the thread count: a 1x1
# convolution of fewer than 16 images runs through THNN on one thread and oneDNN on more, and
# oneDNN's kernels for batches of 2 or 3 change with the thread count too. Their results differ
# in the last bits, so a rank with its share of the cores would write other probabilities than
# one process with all of them. From 16 images up every model of the registry gives the same
# bits at 1 to 16 threads. The cost is the padding of each block's last batch, 7.5 windows on
# average: about 1 in 16 of the 256 px windows of a 2048 px block, fewer than 1 in 200 of its
# 64 px ones; nothing on a GPU.
CPU_MIN_BATCH = 16


class TorchWindowModel:
    """An `nn.Module` (a model file's model or a TorchScript module) without autograd.

    On the CPU a batch of fewer than CPU_MIN_BATCH windows is padded with zeros to that many
    (their logits are dropped), so that its logits do not depend on the thread count.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, pixels: torch.Tensor) -> Any:
        count = pixels.shape[0]
        if pixels.device.type == "cpu" and count < CPU_MIN_BATCH:
            padding = pixels.new_zeros((CPU_MIN_BATCH - count, *pixels.shape[1:]))
            pixels = torch.cat([pixels, padding])
        with torch.inference_mode():
            logits = self.module(pixels)
        return logits[:count] if isinstance(logits, torch.Tensor) else logits


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
        if kind == "torchscript":  # export takes model.pt files only
            raise PredictionError(
                f"--runtime onnxruntime runs ONNX files, not {url} (a TorchScript file); run it "
                f"with --runtime torch, or export {EXPORT_SOURCE} with "
                "`landcover export RUN_DIR/model.pt --format onnx --out model.onnx`"
            )
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
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    elif device.type == "cuda":
        logger.warning(
            "onnxruntime here has no CUDA provider (pip install onnxruntime-gpu); "
            "running the ONNX model on the CPU"
        )
    elif device.type != "cpu":
        logger.warning(
            "--device %s: landcover runs ONNX models on CUDA or the CPU; running it on the CPU",
            device,
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
    check_graph_matches_meta(session, meta, url)
    logger.info("running %s with onnxruntime (%s)", url, ", ".join(session.get_providers()))
    return OnnxWindowModel(session), meta


def check_graph_matches_meta(session: Any, meta: ModelMeta, where: str) -> None:
    """Refuse an ONNX graph that does not take and give what its metadata says: one input and
    one output of rank 4 (batch, channels, height, width), `meta.in_channels` bands in and
    `meta.num_classes` logits out, where the graph names those sizes (a dynamic one passes)."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ModelFileError(
            f"{where}: the ONNX graph has {len(inputs)} inputs and {len(outputs)} outputs; a "
            f"landcover model has one of each (export it again from {EXPORT_SOURCE})"
        )
    for value, role, expected, what in (
        (inputs[0], "input", meta.in_channels, f"bands ({', '.join(meta.band_names)})"),
        (outputs[0], "output", meta.num_classes, f"classes ({meta.class_map.name})"),
    ):
        shape = list(value.shape or [])
        if not shape:  # a graph without shape information: nothing to compare
            continue
        channels = shape[1] if len(shape) == 4 else None
        if len(shape) != 4 or (isinstance(channels, int) and channels != expected):
            raise ModelFileError(
                f"{where}: the ONNX graph's {role} {value.name!r} has shape {shape}, but its "
                f"landcover metadata says (batch, {expected}, height, width) for {expected} "
                f"{what}; the graph and the metadata are of different models: export it "
                f"again from {EXPORT_SOURCE}"
            )
