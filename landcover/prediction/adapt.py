"""Test-time adaptation (`--adapt`, `landcover.prediction.adaptspec`): statistics of the target
imagery, computed once per run, that replace or mix with the training ones.

The statistics are a pure function of the model file, the output grid and the images:
- the sample is a fixed lattice of `SAMPLE_LATTICE` x `SAMPLE_LATTICE` windows of the
  model's chip over the whole output grid (`sample_windows`), read as prediction reads them
  (`landcover.prediction.mosaic.read_mosaic`); windows with less than `MIN_VALID_FRACTION`
  of their pixels covered are left out. No random numbers, no dependence on ranks, tiles or
  blocks;
- the band statistics are float64 means and (population) standard deviations over the valid
  pixels of the sample (`band_statistics`);
- the BatchNorm statistics come from one forward pass of the whole sample as one batch, on
  the CPU on one thread (so the bits do not depend on the device, the thread count or the
  batch split), through a copy of the model in eval mode whose BatchNorm layers are adapted
  one after the other as the pass reaches them (`bn_statistics`).

So every rank, tile and task of a job computes the same numbers, and the part and tile keys
record their digest (`Adaptation.key`, carried in `PredictConfig.adapt`): a part made with
other statistics is never reused. The output's tags record the method, the digest and the band
statistics used (`Adaptation.tags`). With onnxruntime the adapted model (the model file's
weights with the adapted BatchNorm buffers) is saved once per digest in the user's cache and
exported from there (`landcover.prediction.backends.onnxcache`): the exporter folds BatchNorm
into constants, so the adapted statistics must be in the exported model, and the cache key is
the adapted file's digest.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from landcover.data.normalise import normalise
from landcover.errors import PredictionError
from landcover.models.export import model_digest, model_kind
from landcover.models.modelfile import ModelMeta, load_model_file, save_model_file
from landcover.prediction.adaptspec import (
    EARLY_BN_LAYERS,
    TAG_ADAPT,
    TAG_ADAPT_BANDS,
    TAG_ADAPT_SHA256,
    AdaptSpec,
    parse_adapt,
)
from landcover.prediction.backends.onnxcache import cache_dir
from landcover.prediction.gridwindow import Window
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.runtime import (
    BackendModel,
    Inference,
    OnnxWindowModel,
    TorchWindowModel,
    load_window_model,
)
from tiling.sources.reader import RasterReader

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig
    from landcover.prediction.outgrid import GridPlan

__all__ = [
    "MIN_VALID_FRACTION",
    "SAMPLE_LATTICE",
    "Adaptation",
    "AdaptedInference",
    "adapt_prediction",
    "adapted_module",
    "band_statistics",
    "bn_statistics",
    "compute_adaptation",
    "sample_pixels",
    "sample_windows",
]

logger = logging.getLogger(__name__)

SAMPLE_LATTICE = 6  # up to 36 windows of the model's chip
MIN_VALID_FRACTION = 0.5
MIN_BAND_STD = 1.0  # one grey level: a flat band's target std would divide by zero


# (layer name in the state dict, running mean, running var) per adapted BatchNorm layer
BnStats = tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]


@dataclass(frozen=True, slots=True)
class Adaptation:
    """The statistics a run adapts its model with: the band normalisation the windows get and
    the BatchNorm buffers (those adapted; the others stay the model's)."""

    spec: AdaptSpec
    band_mean: tuple[float, ...]
    band_std: tuple[float, ...]
    bn: BnStats
    windows: int  # windows of the sample

    def to_json(self) -> dict[str, Any]:
        """Everything the adaptation is, as JSON values (float32 numbers, as applied)."""
        return {
            "adapt": str(self.spec),
            "windows": self.windows,
            "band_mean": list(self.band_mean),
            "band_std": list(self.band_std),
            "bn": [[name, list(mean), list(var)] for name, mean, var in self.bn],
        }

    @property
    def digest(self) -> str:
        """SHA-256 of `to_json` in canonical form."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def key(self) -> str:
        """`METHOD:STRENGTH@DIGEST`: the value `PredictConfig.adapt` carries once computed."""
        return f"{self.spec}@{self.digest}"

    def tags(self) -> dict[str, str]:
        """The GeoTIFF tags that record the adaptation."""
        bands = {"mean": list(self.band_mean), "std": list(self.band_std)}
        return {
            TAG_ADAPT: str(self.spec),
            TAG_ADAPT_SHA256: self.digest,
            TAG_ADAPT_BANDS: json.dumps(bands, separators=(",", ":")),
        }


@dataclass(frozen=True, slots=True)
class AdaptedInference(Inference):
    """What runs a model, and the adaptation it runs with (both in the tags)."""

    adaptation: Adaptation

    def tags(self) -> dict[str, str]:
        return {**Inference.tags(self), **self.adaptation.tags()}


def sample_windows(height: int, width: int, size: int) -> list[Window]:
    """The lattice of up to SAMPLE_LATTICE^2 windows of `size` px, evenly spaced over a grid
    of `height` x `width` px (corners included; windows may reach past a grid smaller than
    `size`)."""

    def starts(extent: int) -> list[int]:
        if extent <= size:
            return [0]
        last = extent - size
        return sorted({round(i * last / (SAMPLE_LATTICE - 1)) for i in range(SAMPLE_LATTICE)})

    return [Window(r, c, size, size) for r in starts(height) for c in starts(width)]


def sample_pixels(
    plan: GridPlan, size: int, *, storage_options: Mapping[str, Any] | None = None
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """The sample's pixels (n, bands, size, size) and their validity (n, size, size): the
    `sample_windows` of the grid with at least MIN_VALID_FRACTION of their pixels covered.
    `PredictionError` when no window is."""
    reader = RasterReader(storage_options=storage_options)
    kept: list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]] = []
    try:
        for window in sample_windows(plan.grid.height, plan.grid.width, size):
            values, valid = read_mosaic(plan, reader, window)
            if valid.mean() >= MIN_VALID_FRACTION:
                kept.append((values, valid))
    finally:
        reader.close()
    if not kept:
        raise PredictionError(
            "--adapt: no window of the region has enough image pixels to measure its "
            "statistics; predict a larger region or use --adapt none"
        )
    return np.stack([v for v, _ in kept]), np.stack([m for _, m in kept])


def band_statistics(
    pixels: npt.NDArray[np.uint8], valid: npt.NDArray[np.bool_]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-band mean and population standard deviation (float64) of the valid pixels of
    `pixels` (n, bands, h, w) under `valid` (n, h, w)."""
    values = np.moveaxis(pixels, 1, 0)[:, valid].astype(np.float64)  # (bands, pixels)
    if values.shape[1] == 0:
        raise PredictionError("--adapt: the sample has no valid pixel; use --adapt none")
    return tuple(float(v) for v in values.mean(axis=1)), tuple(float(v) for v in values.std(axis=1))


def _mixed(train: Sequence[float], target: Sequence[float], strength: float) -> tuple[float, ...]:
    """`(1 - s) * train + s * target`, each rounded to float32 (what the model computes in)."""
    return tuple(
        float(np.float32((1.0 - strength) * a + strength * b))
        for a, b in zip(train, target, strict=True)
    )


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bn_layers(module: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    return [
        (name, m)
        for name, m in module.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        and m.track_running_stats
        and m.running_mean is not None
        and m.running_var is not None
    ]


def bn_statistics(
    module: nn.Module, x: torch.Tensor, *, strength: float, first: int | None = None
) -> BnStats:
    """The adapted running statistics of `module`'s BatchNorm layers for the normalised
    sample `x` (n, bands, h, w): each layer's, in the order the forward pass reaches them,
    `(1 - strength) * trained + strength * measured` (the measured: float64 mean and
    population variance of the layer's input over all but the channel dimension), with the
    layers before it already adapted. `first`: adapt only the first that many layers. One
    pass of `x` as one batch on the CPU, one thread; `module` is not changed.
    `PredictionError` when it has no BatchNorm layer (e.g. Segformer's LayerNorms)."""
    work = copy.deepcopy(module).to("cpu").eval()
    layers = _bn_layers(work)
    if not layers:
        raise PredictionError(
            "--adapt bn: the model has no BatchNorm layers (it normalises with LayerNorm, e.g. "
            "segformer), so there are no statistics to adapt; use --adapt bands or none"
        )
    names = {id(m): name for name, m in layers}
    done: list[str] = []

    def hook(layer: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        name = names[id(layer)]
        if name in done or (first is not None and len(done) >= first):
            return
        done.append(name)
        h = inputs[0].detach().to(torch.float64)
        dims = [d for d in range(h.ndim) if d != 1]
        mean, var = h.mean(dim=dims), h.var(dim=dims, unbiased=False)
        running_mean, running_var = layer.running_mean, layer.running_var
        assert isinstance(running_mean, torch.Tensor) and isinstance(running_var, torch.Tensor)
        new_mean = (1 - strength) * running_mean.to(torch.float64) + strength * mean
        new_var = (1 - strength) * running_var.to(torch.float64) + strength * var
        running_mean.copy_(new_mean.to(running_mean.dtype))
        running_var.copy_(new_var.to(running_var.dtype))

    handles = [m.register_forward_pre_hook(hook) for _, m in layers]
    try:
        with _one_thread(), torch.inference_mode():
            work(x.to("cpu", torch.float32))
    finally:
        for handle in handles:
            handle.remove()
    by_name = dict(layers)
    stats = []
    for name in done:
        layer = by_name[name]
        assert layer.running_mean is not None and layer.running_var is not None
        stats.append(
            (
                name,
                tuple(float(v) for v in layer.running_mean.tolist()),
                tuple(float(v) for v in layer.running_var.tolist()),
            )
        )
    return tuple(stats)


def adapted_module(module: nn.Module, bn: BnStats) -> nn.Module:
    """A copy of `module` (on its device) whose BatchNorm buffers named in `bn` hold those
    statistics."""
    out = copy.deepcopy(module)
    layers = dict(_bn_layers(out))
    for name, mean, var in bn:
        layer = layers[name]
        assert layer.running_mean is not None and layer.running_var is not None
        layer.running_mean.copy_(torch.tensor(mean, dtype=layer.running_mean.dtype))
        layer.running_var.copy_(torch.tensor(var, dtype=layer.running_var.dtype))
    return out


def compute_adaptation(
    spec: AdaptSpec,
    meta: ModelMeta,
    pixels: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.bool_],
    module: nn.Module | None = None,
) -> Adaptation:
    """The adaptation `spec` of the model (`meta`; `module` for the BatchNorm methods) to the
    sample (`sample_pixels`)."""
    band_mean = tuple(float(np.float32(v)) for v in meta.band_mean)
    band_std = tuple(float(np.float32(v)) for v in meta.band_std)
    if spec.uses_bands:
        target_mean, target_std = band_statistics(pixels, valid)
        target_std = tuple(max(s, MIN_BAND_STD) for s in target_std)
        band_mean = _mixed(meta.band_mean, target_mean, spec.strength)
        band_std = _mixed(meta.band_std, target_std, spec.strength)
    bn: BnStats = ()
    if spec.uses_bn:
        if module is None:
            raise ValueError("the BatchNorm methods need the model")  # a bug
        x = normalise(
            torch.from_numpy(pixels),
            torch.tensor(band_mean, dtype=torch.float32).view(1, -1, 1, 1),
            torch.tensor(band_std, dtype=torch.float32).view(1, -1, 1, 1),
            valid=torch.from_numpy(valid),
        )
        first = EARLY_BN_LAYERS if spec.method == "bn-early" else None
        bn = bn_statistics(module, x, strength=spec.strength, first=first)
    return Adaptation(spec, band_mean, band_std, bn, int(pixels.shape[0]))


def adapt_prediction(
    config: PredictConfig,
    model: BackendModel,
    meta: ModelMeta,
    plan: GridPlan,
    device: torch.device,
) -> tuple[PredictConfig, BackendModel, ModelMeta]:
    """The prediction's setup with `config.adapt` applied: the config carrying the
    adaptation's key (so that part and tile keys record its statistics), the model with the
    adapted BatchNorm statistics and the adaptation in its tags, and the metadata with the
    band statistics the windows are normalised with. `--adapt none` returns them as they are.
    Call it with the model `load_window_model` gave, before `for_prediction`."""
    spec = parse_adapt(config.adapt)
    if not spec.active:
        return config, model, meta
    kind = model_kind(config.model, storage_options=config.storage_options)
    if spec.uses_bn and kind != "model":
        raise PredictionError(
            f"--adapt {spec.method}: adapts the BatchNorm layers of a model file (model.pt), "
            f"not of {config.model} (an exported {kind} file); use --adapt bands, or predict "
            "with the model.pt"
        )
    pixels, valid = sample_pixels(plan, meta.chip_size, storage_options=config.storage_options)
    module = None
    if spec.uses_bn:
        module = model.module if isinstance(model, TorchWindowModel) else None
        if module is None:
            module, _ = load_model_file(
                config.model, device=torch.device("cpu"), storage_options=config.storage_options
            )
    adaptation = compute_adaptation(spec, meta, pixels, valid, module)
    logger.info(
        "--adapt %s: statistics of %d windows (sha256 %s)",
        spec,
        adaptation.windows,
        adaptation.digest[:16],
    )
    adapted = _adapted_backend(model, adaptation, config, device, module)
    meta = replace(meta, band_mean=adaptation.band_mean, band_std=adaptation.band_std)
    return replace(config, adapt=adaptation.key), adapted, meta


def _tagged(model: BackendModel, adaptation: Adaptation) -> BackendModel:
    """`model` with the adaptation in its `inference` (and so in the outputs' tags)."""
    if not isinstance(model, TorchWindowModel | OnnxWindowModel):
        raise TypeError(f"cannot adapt a {type(model).__name__}")  # a bug
    ran = model.inference
    model.inference = AdaptedInference(ran.backend, ran.precision, ran.provider, adaptation)
    return model


def _adapted_backend(
    model: BackendModel,
    adaptation: Adaptation,
    config: PredictConfig,
    device: torch.device,
    module: nn.Module | None,
) -> BackendModel:
    if not adaptation.bn or module is None:  # bands only: the same model
        if isinstance(model, TorchWindowModel) and model.onnx is not None:
            export = model.onnx
            model.onnx = lambda: _tagged(export(), adaptation)
        return _tagged(model, adaptation)
    if isinstance(model, TorchWindowModel):
        onnx = None
        if model.onnx is not None:  # `auto`: onnxruntime runs the adapted model's export
            onnx = _deferred_adapted_export(module, adaptation, config, device)
        adapted = TorchWindowModel(
            adapted_module(module, adaptation.bn).to(model.device),
            device=model.device,
            precision=model.precision,
            onnx=onnx,
        )
        return _tagged(adapted, adaptation)
    return _deferred_adapted_export(module, adaptation, config, device)()


def _deferred_adapted_export(
    module: nn.Module, adaptation: Adaptation, config: PredictConfig, device: torch.device
) -> Callable[[], BackendModel]:
    def export() -> BackendModel:
        path = _adapted_model_file(module, adaptation, config)
        model, _ = load_window_model(str(path), backend="onnxruntime", device=device)
        return _tagged(model, adaptation)

    return export


def _adapted_model_file(module: nn.Module, adaptation: Adaptation, config: PredictConfig) -> Path:
    """The model file with the adapted BatchNorm statistics, saved once per (model file,
    adaptation) digest in the user's cache; its ONNX export is cached beside it."""
    _, meta = load_model_file(
        config.model, device=torch.device("cpu"), storage_options=config.storage_options
    )
    digest = model_digest(config.model, storage_options=config.storage_options)
    key = hashlib.sha256(f"{digest}:{adaptation.digest}".encode()).hexdigest()
    path = cache_dir().parent / "adapted" / f"{key[:32]}.pt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise PredictionError(
            f"--adapt: cannot save the adapted model in {path.parent} ({exc.strerror}); "
            "set XDG_CACHE_HOME to a writable directory, or use --backend torch"
        ) from None
    try:
        # One writer per machine: the ranks of a job find the file the first one wrote, and
        # its digest (the key of its export) never changes under another's export.
        fcntl.flock(lock, fcntl.LOCK_EX)
        # a truncated file (a full disk, a copy cut short) is written again, not trusted: the
        # model file is a zip whose directory is its last bytes
        if not (path.is_file() and zipfile.is_zipfile(path)):
            save_model_file(path, adapted_module(module, adaptation.bn).to("cpu"), meta)
    finally:
        os.close(lock)
    return path
