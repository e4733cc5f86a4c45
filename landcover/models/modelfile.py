"""The self-describing model file (`model.pt`).

A model file is a plain dict of tensors, numbers, strings and lists saved with `torch.save`,
so it loads with `torch.load(weights_only=True)`: opening a model never runs code. It carries
everything prediction needs: architecture, class table, band statistics, chip size and
resolution, plus a summary of how it was trained.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
import torch
from torch import nn

from landcover.errors import ModelFileError
from landcover.models.registry import build_model
from landcover.outputs import write_atomic
from tiling.runtime.urls import is_local, local_path
from tiling.sources.classes import ClassMap

MODEL_FORMAT = "landcover-model"
MODEL_FORMAT_VERSION = 1
# torch.save writes a zip archive (since PyTorch 1.6), before that a bare pickle (protocol 2).
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What a model file says about its model (everything but the weights)."""

    architecture: str
    class_map: ClassMap
    band_names: tuple[str, ...]
    band_mean: tuple[float, ...]
    band_std: tuple[float, ...]
    chip_size: int
    resolution_m: float
    training: Mapping[str, Any] = field(default_factory=dict)

    @property
    def in_channels(self) -> int:
        return len(self.band_names)

    @property
    def num_classes(self) -> int:
        return self.class_map.num_classes


def meta_to_json(meta: ModelMeta) -> dict[str, Any]:
    """The metadata a model file holds, as JSON-able values with the format name and version:
    `model.pt` stores it beside its weights, exported ONNX and TorchScript files as JSON."""
    return {
        "format": MODEL_FORMAT,
        "version": MODEL_FORMAT_VERSION,
        "architecture": meta.architecture,
        "in_channels": meta.in_channels,
        "num_classes": meta.num_classes,
        "class_map": meta.class_map.to_json(),
        "band_names": list(meta.band_names),
        "band_mean": [float(v) for v in meta.band_mean],
        "band_std": [float(v) for v in meta.band_std],
        "chip_size": int(meta.chip_size),
        "resolution_m": float(meta.resolution_m),
        "training": dict(meta.training),
    }


def meta_from_json(payload: object, *, where: str, not_ours: str) -> ModelMeta:
    """The `ModelMeta` of `meta_to_json`'s dict; `ModelFileError` starting with `where` when it
    is damaged or newer than this landcover, `not_ours` when it is not a landcover model's."""
    if not isinstance(payload, Mapping) or payload.get("format") != MODEL_FORMAT:
        raise ModelFileError(not_ours)
    version = int(payload.get("version", 0))
    if version > MODEL_FORMAT_VERSION:
        raise ModelFileError(
            f"{where}: model format version {version} is newer than this landcover "
            f"({MODEL_FORMAT_VERSION}); upgrade landcover"
        )
    try:
        return ModelMeta(
            architecture=str(payload["architecture"]),
            class_map=ClassMap.from_json(payload["class_map"]),
            band_names=tuple(str(b) for b in payload["band_names"]),
            band_mean=tuple(float(v) for v in payload["band_mean"]),
            band_std=tuple(float(v) for v in payload["band_std"]),
            chip_size=int(payload["chip_size"]),
            resolution_m=float(payload["resolution_m"]),
            training=dict(payload.get("training", {})),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{where}: damaged landcover model file (missing {exc})") from None


def save_model_file(path: str | os.PathLike[str], model: nn.Module, meta: ModelMeta) -> None:
    """Write `model.pt` atomically (temp file in the same directory, then rename)."""
    state = {k: v.detach().cpu().clone() for k, v in _unwrap(model).state_dict().items()}
    payload: dict[str, Any] = {**meta_to_json(meta), "state_dict": state}
    write_atomic(path, lambda tmp: torch.save(payload, tmp))


def read_model_file(
    url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> tuple[ModelMeta, dict[str, torch.Tensor]]:
    """Read and validate a model file without building the model."""
    return _read_payload(url, storage_options, mapped=False)


def read_model_meta(
    url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> ModelMeta:
    """The metadata of a model file, validated as `read_model_file` validates it, without
    reading its weights into memory where the file is local (they are mapped, never touched,
    and unmapped on return); a remote file is read whole and its weights dropped."""
    meta, _ = _read_payload(url, storage_options, mapped=True)
    return meta


def _read_payload(
    url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, *, mapped: bool
) -> tuple[ModelMeta, dict[str, torch.Tensor]]:
    """The metadata and the state dict of a model file; `mapped`: a local zip file's tensors
    are memory-mapped (`torch.load(mmap=True)`) instead of read."""
    where = os.fspath(url)
    head = b""
    not_ours = f"{where} is not a landcover model file (model.pt from `landcover train`)"
    try:
        with fsspec.open(where, "rb", **dict(storage_options or {})) as f:
            # Anything else (a GeoTIFF, a text file) is not ours, and torch.load would name
            # the wrong problem. Pickles still go to torch.load, to be refused if they hold code.
            head = f.read(len(_ZIP_MAGIC))
            f.seek(0)
            if not head.startswith((_ZIP_MAGIC, _PICKLE_MAGIC)):
                raise ModelFileError(not_ours)
            if mapped and head == _ZIP_MAGIC and is_local(where):
                payload = torch.load(
                    local_path(where), map_location="cpu", weights_only=True, mmap=True
                )
            else:
                payload = torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelFileError(f"{where}: model file not found") from None
    except IsADirectoryError:
        raise ModelFileError(f"{not_ours}; it is a directory") from None
    except pickle.UnpicklingError:
        raise ModelFileError(
            f"{where}: refused to load: the file needs to unpickle code, which a landcover "
            "model never does; use a model.pt written by `landcover train`"
        ) from None
    except ModelFileError:
        raise
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
        if not head:  # opening it or reading its first bytes failed
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ModelFileError(f"{where}: cannot read the model file ({reason})") from None
        if head == _ZIP_MAGIC and not _is_complete_zip(where, storage_options):
            raise ModelFileError(
                f"{where}: damaged landcover model file (truncated or corrupt: its zip "
                "directory is missing); copy it again or re-export it with `landcover train`"
            ) from None
        raise ModelFileError(not_ours) from None  # e.g. a zip archive, but not torch's
    meta = meta_from_json(payload, where=where, not_ours=not_ours)
    try:
        state = dict(payload["state_dict"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{where}: damaged landcover model file (missing {exc})") from None
    return meta, state


def _is_complete_zip(where: str, storage_options: Mapping[str, Any] | None) -> bool:
    """Whether the file ends with a zip central directory (a copy cut short does not)."""
    try:
        with fsspec.open(where, "rb", **dict(storage_options or {})) as f:
            return zipfile.is_zipfile(f)
    except OSError:
        return False


def load_model_file(
    url: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, ModelMeta]:
    """Build the model a file describes, load its weights, and put it in eval mode."""
    meta, state = read_model_file(url, storage_options=storage_options)
    model = build_model(
        meta.architecture, in_channels=meta.in_channels, num_classes=meta.num_classes
    )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelFileError(
            f"{os.fspath(url)}: weights do not fit {meta.architecture}: {first}"
        ) from None
    return model.to(device).eval(), meta


def _unwrap(model: nn.Module) -> nn.Module:
    # DistributedDataParallel keeps the real model in .module.
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model
