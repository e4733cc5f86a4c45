"""Exported model files made by hand (an ONNX convolution, a TorchScript identity) with the
metadata `landcover export` writes, for the tests of loading them to predict."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from landcover.models.modelfile import ModelMeta, meta_to_json
from tests.landcover.prediction.inputs import CHIP, CLASS_MAP

BANDS = ("red", "green", "blue", "nir")

META = ModelMeta(
    architecture="small_unet",
    class_map=CLASS_MAP,
    band_names=BANDS,
    band_mean=(110.0,) * 4,
    band_std=(60.0,) * 4,
    chip_size=CHIP,
    resolution_m=1.0,
)

META_JSON = json.dumps(meta_to_json(META))


def write_onnx(path: Path, *, bands: int, classes: int, metadata: str | None = META_JSON) -> Path:
    """A 1 x 1 convolution from `bands` to `classes` channels as an ONNX file, with `metadata`
    under the key export writes it to."""
    weights = numpy_helper.from_array(np.zeros((classes, bands, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixels", "w"], ["logits"])],
        "conv",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", bands, "h", "w"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes, "h", "w"])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    if metadata is not None:
        helper.set_model_props(model, {"landcover": metadata})
    onnx.save(model, str(path))
    return path


def write_torchscript(path: Path, *, metadata: str = META_JSON) -> Path:
    """A TorchScript file (an identity) with `metadata` as export's extra file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation note
        module = torch.jit.script(torch.nn.Identity())
        torch.jit.save(module, str(path), _extra_files={"landcover.json": metadata})
    return path
