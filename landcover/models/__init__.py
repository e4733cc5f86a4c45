"""Segmentation models: the registry (`available`, `build_model`), `small_unet`, smp models
(`smp:ARCH:ENCODER`, `unet_resnet*`), torchvision models with 4-band stems, and the
self-describing model file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.models.modelfile import (
        ModelMeta,
        load_model_file,
        read_model_file,
        read_model_meta,
        save_model_file,
    )
    from landcover.models.registry import available, build_model

__all__ = [
    "ModelMeta",
    "available",
    "build_model",
    "load_model_file",
    "read_model_file",
    "read_model_meta",
    "save_model_file",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "available": "registry",
        "build_model": "registry",
        "ModelMeta": "modelfile",
        "load_model_file": "modelfile",
        "read_model_file": "modelfile",
        "read_model_meta": "modelfile",
        "save_model_file": "modelfile",
    },
)
