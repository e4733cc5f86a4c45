"""What `--pretrained` may name: `imagenet` (the encoder's ImageNet weights from a local cache)
or the path of a weights file. Torch-free, so a configuration is checked without importing
torch; `landcover.models.pretrained` reads the weights."""

from __future__ import annotations

import os

from landcover.errors import TrainingError

__all__ = ["IMAGENET", "WEIGHT_FILE_SUFFIXES", "check_pretrained_value", "is_weights_path"]

IMAGENET = "imagenet"
# torch.save files (.pth, .pt, .bin, .ckpt) and safetensors
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")


def is_weights_path(value: str) -> bool:
    """Whether a `--pretrained` value names a file (by its suffix, or a directory in it)."""
    return value.lower().endswith(WEIGHT_FILE_SUFFIXES) or os.sep in value or "/" in value


def check_pretrained_value(value: str | None) -> None:
    """Refuse a `--pretrained` value that is neither `imagenet`, a weights file path nor None
    (left out), and a directory; whether the file exists is checked where the model is built
    (on the worker's machine)."""
    if value is None or value == IMAGENET:
        return
    if os.path.isdir(value):
        raise TrainingError(
            f"--pretrained {value} is a directory; give the weights file in it (an encoder "
            f"state dict: {', '.join(WEIGHT_FILE_SUFFIXES)})"
        )
    if is_weights_path(value):
        return
    raise TrainingError(
        f"--pretrained {value!r} is not known; give {IMAGENET} or the path of an encoder "
        f"weights file ({', '.join(WEIGHT_FILE_SUFFIXES)}), or leave out --pretrained"
    )
