"""ONNX files run by onnxruntime: `OnnxWindowModel` (a session per thread count) and
`onnx_model`, which opens one on the prediction's device and checks it against its landcover
metadata."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import torch

from landcover.errors import ExportError, ModelFileError, PredictionError
from landcover.models.export import meta_from_onnx_props, onnx_model_digest, require_onnx
from landcover.models.modelfile import ModelMeta
from landcover.prediction.backends.inference import Inference
from landcover.prediction.backends.onnxgraph import check_graph_matches_meta

__all__ = ["OnnxWindowModel", "onnx_model"]

logger = logging.getLogger(__name__)


class OnnxWindowModel:
    """An onnxruntime session; copies pixels to host memory and logits back to their device.

    On the CPU the session runs on as many threads as torch has now (the ranks of a machine
    pool theirs: `landcover.prediction.distributed`); a session is made per thread count.
    """

    def __init__(self, model_bytes: bytes, providers: list[Any], *, ort: Any, where: str) -> None:
        self.model_bytes, self.providers, self.ort, self.where = model_bytes, providers, ort, where
        self.sessions: dict[int, Any] = {}
        session = self.session()
        self.input_name = session.get_inputs()[0].name
        self.output_name = session.get_outputs()[0].name
        provider = session.get_providers()[0]
        self.inference = Inference("onnxruntime", "fp32", provider)

    def session(self) -> Any:
        """The session for torch's thread count now (made on first use)."""
        threads = torch.get_num_threads()
        if threads not in self.sessions:
            options = self.ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # Idle workers sleep instead of spinning between operators and batches: the
            # pipeline's reading and writing threads need those cores meanwhile.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                self.sessions[threads] = self.ort.InferenceSession(
                    self.model_bytes, options, providers=self.providers
                )
            except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidProtobuf
                reason = " ".join(str(exc).split())[:200]
                raise ModelFileError(
                    f"{self.where}: not a readable ONNX model ({reason})"
                ) from None
        return self.sessions[threads]

    def __call__(self, pixels: torch.Tensor) -> Any:
        array = pixels.detach().to("cpu", torch.float32).contiguous().numpy()
        (logits,) = self.session().run([self.output_name], {self.input_name: array})
        return torch.from_numpy(logits).to(pixels.device)


def onnx_model(
    url: str,
    device: torch.device,
    storage_options: Mapping[str, Any] | None,
    *,
    digest: str | None = None,
) -> tuple[OnnxWindowModel, ModelMeta]:
    """An ONNX file run by onnxruntime; `digest`: the model file's digest the file must
    record (a cached export), None for an ONNX file given as the model."""
    try:
        ort = require_onnx("onnxruntime")
    except ExportError as exc:
        raise PredictionError(f"--backend onnxruntime: {exc}") from None
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
    model = OnnxWindowModel(model_bytes, providers, ort=ort, where=url)
    props = model.session().get_modelmeta().custom_metadata_map
    if digest is not None and onnx_model_digest(props) != digest:
        raise ModelFileError(
            f"{url}: the cached ONNX export was replaced by another model's while it loaded; "
            f"run the command again (or delete {Path(url).name})"
        )
    meta = meta_from_onnx_props(props, url)
    check_graph_matches_meta(model.session(), meta, url)
    logger.info("running %s with onnxruntime (%s)", url, ", ".join(model.session().get_providers()))
    return model, meta
