"""The model behind a prediction, whatever runs it: one interface over the backends.

`load_window_model` opens a model for `predict_region` and returns a `BackendModel`
(normalised pixels in, logits out, both torch tensors on the prediction device; `inference`
says what runs it) with the model's metadata. The backends (`--backend`):
- `torch`: a landcover model file (`model.pt`) or a TorchScript file from
  `landcover export --format torchscript`, run by PyTorch (eager);
- `onnxruntime`: an ONNX file from `landcover export --format onnx`, or a `model.pt` exported
  to ONNX once and cached by its digest (`landcover.prediction.backends.onnxcache`), run by
  onnxruntime: the CPU provider, or the CUDA provider first for a CUDA device when the
  installed onnxruntime has it. Pixels are normalised by `landcover.data.normalise` on torch
  tensors as for PyTorch, then handed to onnxruntime as numpy arrays. The graph's input and
  output must match the metadata (bands, classes) where its shapes name them;
- `auto`: onnxruntime for *.onnx files and torch for TorchScript files. For a `model.pt` on
  the CPU, onnxruntime where it is installed (bench_predict.py measures it against torch
  eager) once the prediction is large enough to pay for the one-time export
  (`AUTO_ONNX_MIN_WINDOW_PIXELS`, decided by `for_prediction` from the whole grid, so every
  rank, tile and task of a job decides the same; until then only the model file's metadata
  is read, so a prediction that onnxruntime runs never builds the torch model); torch on
  other devices and for bf16.

The precision (`--precision`): fp32, or bf16 through torch's autocast where the hardware has
native bf16 (a CPU with AVX-512 BF16 or AMX, `landcover.prediction.backends.cpu`; a CUDA GPU
that supports it); refused in one line elsewhere and with onnxruntime. int8: a model file's
ONNX export quantized once by onnxruntime, calibrated on a chip store's chips and cached
(`landcover.prediction.backends.quantize`), run by onnxruntime (`auto` resolves to it) on a
CPU with int8 dot products (VNNI); refused in one line with torch and elsewhere. `auto` is
fp32: bench_predict.py measures how far bf16 and int8 agree with it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from landcover.errors import ExportError, PredictionError
from landcover.models.export import (
    EXPORT_SOURCE,
    load_torchscript,
    meta_from_onnx_props,
    model_kind,
    require_onnx,
    require_onnx_installed,
)
from landcover.models.modelfile import ModelMeta, load_model_file, read_model_meta
from landcover.prediction.backends.calibration import calibration_sample
from landcover.prediction.backends.cpu import cpu_features
from landcover.prediction.backends.inference import (
    TAG_BACKEND,
    TAG_CALIBRATION,
    TAG_CALIBRATION_SHA256,
    TAG_PRECISION,
    TAG_PROVIDER,
    Inference,
    QuantizedInference,
)
from landcover.prediction.backends.onnxcache import cached_onnx
from landcover.prediction.backends.onnxgraph import check_graph_matches_meta
from landcover.prediction.backends.onnxmodel import OnnxWindowModel, onnx_model
from landcover.prediction.backends.quantize import cached_int8
from landcover.prediction.choices import (
    AUTO_ONNX_MIN_WINDOW_PIXELS,
    BACKENDS,
    PRECISIONS,
    Backend,
    Precision,
    int8_choice_problem,
)

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig

__all__ = [
    "CPU_MIN_BATCH",
    "TAG_BACKEND",
    "TAG_CALIBRATION",
    "TAG_CALIBRATION_SHA256",
    "TAG_PRECISION",
    "TAG_PROVIDER",
    "BackendModel",
    "Inference",
    "OnnxWindowModel",
    "QuantizedInference",
    "TorchWindowModel",
    "WindowModel",
    "auto_onnx_min_window_pixels",
    "check_graph_matches_meta",
    "for_prediction",
    "load_window_model",
    "resolve_precision",
    "torch_threads",
    "with_inference",
]

logger = logging.getLogger(__name__)


class WindowModel(Protocol):
    """Logits (n, classes, h, w) for normalised pixels (n, bands, h, w), on their device."""

    def __call__(self, pixels: torch.Tensor) -> Any: ...


class BackendModel(WindowModel, Protocol):
    """A `WindowModel` that says what runs it."""

    @property
    def inference(self) -> Inference: ...


# On the CPU, PyTorch picks a convolution's kernel by the batch and the thread count: a 1x1
# convolution of fewer than 16 images runs through THNN on one thread and oneDNN on more, and
# oneDNN's kernels for batches of 2 or 3 change with the thread count too. Their results differ
# in the last bits, so a rank with its share of the cores would write other probabilities than
# one process with all of them. From 16 images up every model of the registry gives the same
# bits at 1 to 16 threads. The cost is the padding of each block's last batch, 7.5 windows on
# average: about 1 in 16 of the 256 px windows of a 2048 px block, fewer than 1 in 200 of its
# 64 px ones; nothing on a GPU. onnxruntime's CPU kernels give the same bits at any batch and
# thread count (tests/landcover/prediction/test_backends.py), so it runs batches unpadded.
CPU_MIN_BATCH = 16


class TorchWindowModel:
    """An `nn.Module` (a model file's model or a TorchScript module) without autograd, in fp32
    or under bf16 autocast.

    On the CPU a batch of fewer than CPU_MIN_BATCH windows is padded with zeros to that many
    (their logits are dropped), so that its logits do not depend on the thread count.
    `module` is the module, or a function that loads it on first use (`--backend auto` on a
    model file: a prediction that onnxruntime runs never builds the torch model; then
    `device` is required). `onnx`: for `auto` on a model file, makes the onnxruntime model
    `for_prediction` switches to for a large prediction; None otherwise.
    """

    def __init__(
        self,
        module: nn.Module | Callable[[], nn.Module],
        *,
        device: torch.device | None = None,
        precision: str = "fp32",
        onnx: Callable[[], BackendModel] | None = None,
    ) -> None:
        self._module = module if isinstance(module, nn.Module) else None
        self._load = None if isinstance(module, nn.Module) else module
        if device is None and self._module is None:
            raise TypeError("a module loaded on first use needs its device")  # a bug
        self.precision = precision
        self.onnx = onnx
        self.device = device or _module_device(cast(nn.Module, self._module))
        self.inference = Inference("torch", precision, str(self.device))

    @property
    def module(self) -> nn.Module:
        """The module, loaded now if it was not yet."""
        if self._module is None:
            load, self._load = self._load, None
            self._module = cast(Callable[[], nn.Module], load)()
        return self._module

    @property
    def loaded(self) -> bool:
        """Whether the module is in memory (a model onnxruntime runs never loads it)."""
        return self._module is not None

    def load(self) -> None:
        """Load the module now, if it was not yet."""
        _ = self.module

    def __call__(self, pixels: torch.Tensor) -> Any:
        count = pixels.shape[0]
        if pixels.device.type == "cpu" and count < CPU_MIN_BATCH:
            padding = pixels.new_zeros((CPU_MIN_BATCH - count, *pixels.shape[1:]))
            pixels = torch.cat([pixels, padding])
        autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.precision == "bf16":
            autocast = torch.autocast(pixels.device.type, dtype=torch.bfloat16)
        with torch.inference_mode(), autocast:
            logits = self.module(pixels)
        if not isinstance(logits, torch.Tensor):
            return logits
        return logits[:count].float() if self.precision == "bf16" else logits[:count]


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run torch's CPU operators on `count` threads inside the block, then on as many as before.

    Prediction runs its own array work (cutting windows, normalising, blending, argmax) on one
    thread and gives the model the others: an elementwise operator over a window or a block
    is memory-bound, and on a busy machine the OpenMP team of a parallel one waits for its
    members at every barrier, several times the operator's own time (bench_predict.py).
    Elementwise results do not depend on the thread count."""
    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision `--precision` asks for on `device`: auto is fp32; bf16 where the
    hardware has native bf16, int8 on a CPU with int8 dot products; else `PredictionError`
    in one line."""
    if precision not in PRECISIONS:
        raise PredictionError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision in ("auto", "fp32"):
        return "fp32"
    if precision == "int8":
        if device.type != "cpu":
            raise PredictionError(
                f"--precision int8 runs on the CPU (onnxruntime's int8 kernels), not {device}; "
                "use --device cpu, or --precision fp32"
            )
        features = cpu_features()
        if not features.int8:
            raise PredictionError(
                "--precision int8: this CPU has no int8 dot products (AVX-512 VNNI or "
                f"AVX-VNNI; it has {features.describe()}), where onnxruntime's int8 kernels "
                "saturate; use --precision fp32"
            )
        return "int8"
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise PredictionError(
                f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16; use "
                "--precision fp32"
            )
        return "bf16"
    if device.type == "cpu":
        features = cpu_features()
        if not features.bf16:
            raise PredictionError(
                "--precision bf16: this CPU has no native bf16 (AVX-512 BF16 or AMX; it has "
                f"{features.describe()}), where bf16 is slower than fp32; use --precision fp32"
            )
        return "bf16"
    raise PredictionError(f"--precision bf16 runs on the CPU or CUDA, not {device}; use fp32")


def load_window_model(
    url: str,
    *,
    backend: str = "auto",
    precision: str = "auto",
    device: torch.device,
    storage_options: Mapping[str, Any] | None = None,
    calibration: str | None = None,
) -> tuple[BackendModel, ModelMeta]:
    """The model of `url` run by `backend` in `precision` (see the module docstring) and its
    metadata. Under `auto` a model file's metadata is read, and `for_prediction` loads its
    torch model or its onnxruntime export once it has sized the prediction.
    `calibration`: the chip store that calibrates int8 (None: the model's training store)."""
    if backend not in BACKENDS:
        raise PredictionError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    numbers = resolve_precision(precision, device)
    kind = model_kind(url, storage_options=storage_options)
    if numbers == "int8":
        return _quantized_model(url, kind, backend, device, storage_options, calibration)
    if backend == "auto" and kind != "model":
        backend = "onnxruntime" if kind == "onnx" else "torch"
    if backend == "onnxruntime":
        if numbers != "fp32":
            raise PredictionError(
                f"--precision {precision} runs with --backend torch; onnxruntime runs fp32 "
                "and int8 (drop --precision or use --backend torch)"
            )
        if kind == "torchscript":  # export takes model.pt files only
            raise PredictionError(
                f"--backend onnxruntime runs ONNX files and model files, not {url} (a "
                f"TorchScript file); run it with --backend torch, or export {EXPORT_SOURCE} "
                "with `landcover export RUN_DIR/model.pt --format onnx --out model.onnx`"
            )
        if kind == "onnx":
            return onnx_model(url, device, storage_options)
        return _exported_model(url, device, storage_options, auto=False)
    if kind == "onnx":
        raise PredictionError(f"{url} is an ONNX file; use --backend onnxruntime (or auto)")
    if kind == "torchscript":
        module, meta = load_torchscript(url, device=device, storage_options=storage_options)
        return TorchWindowModel(module, device=device, precision=numbers), meta
    if backend == "auto" and device.type == "cpu" and numbers == "fp32" and _onnx_installed():
        # `for_prediction` picks torch or onnxruntime from the whole grid: until then only
        # the metadata is read, so a prediction onnxruntime runs never builds the torch model
        def load() -> nn.Module:
            module, _ = load_model_file(url, device=device, storage_options=storage_options)
            return module

        meta = read_model_meta(url, storage_options=storage_options)
        onnx = _deferred_export(url, device, storage_options)
        return TorchWindowModel(load, device=device, precision=numbers, onnx=onnx), meta
    module, meta = load_model_file(url, device=device, storage_options=storage_options)
    return TorchWindowModel(module, device=device, precision=numbers), meta


def for_prediction(model: BackendModel, window_pixels: int) -> BackendModel:
    """The model to run a prediction whose windows hold `window_pixels` pixels in all (the
    whole grid's, so that every rank and tile decides alike): under `auto`, a model file's
    onnxruntime export from `AUTO_ONNX_MIN_WINDOW_PIXELS` on, else `model` itself, its torch
    module loaded. An export that fails under `auto` is a warning, and torch runs the model."""
    if not isinstance(model, TorchWindowModel):
        return model
    if model.onnx is not None and window_pixels >= auto_onnx_min_window_pixels():
        try:
            return model.onnx()
        except ExportError as exc:
            logger.warning("%s; running the model with torch (--backend torch)", exc)
    model.load()  # torch runs it: its errors (weights that do not fit) come before any output
    return model


def auto_onnx_min_window_pixels() -> int:
    """`AUTO_ONNX_MIN_WINDOW_PIXELS` (a function, so that a test can lower it)."""
    return AUTO_ONNX_MIN_WINDOW_PIXELS


def with_inference(config: PredictConfig, model: BackendModel) -> PredictConfig:
    """`config` (a `PredictConfig`) with the backend and precision that run `model`, so that
    what a part or tile's key records is what ran, not `auto`."""
    ran = model.inference
    calibration = config.calibration
    if isinstance(ran, QuantizedInference):  # the store and its sample's digest
        calibration = f"{ran.calibration}@{ran.calibration_sha256}"
    return replace(
        config,
        backend=cast(Backend, ran.backend),
        precision=cast(Precision, ran.precision),
        calibration=calibration,
    )


def _onnx_installed() -> bool:
    try:
        require_onnx_installed("onnxruntime", "onnx", "onnxscript")
    except ExportError:
        return False
    return True


def _deferred_export(
    url: str, device: torch.device, storage_options: Mapping[str, Any] | None
) -> Callable[[], BackendModel]:
    def export() -> BackendModel:
        model, _ = _exported_model(url, device, storage_options, auto=True)
        return model

    return export


def _exported_model(
    url: str, device: torch.device, storage_options: Mapping[str, Any] | None, *, auto: bool
) -> tuple[BackendModel, ModelMeta]:
    """A model file run by onnxruntime through its cached ONNX export."""
    try:
        require_onnx_installed("onnxruntime", "onnx", "onnxscript")
        path, digest = cached_onnx(url, storage_options=storage_options)
    except ExportError as exc:
        if auto:
            raise
        raise PredictionError(f"--backend onnxruntime: {exc}; or use --backend torch") from None
    model, meta = onnx_model(str(path), device, None, digest=digest)
    logger.info("running %s through its ONNX export %s", url, path)
    return model, meta


def _quantized_model(
    url: str,
    kind: str,
    backend: str,
    device: torch.device,
    storage_options: Mapping[str, Any] | None,
    calibration: str | None,
) -> tuple[BackendModel, ModelMeta]:
    """A model file run by onnxruntime through the int8 quantization of its cached ONNX
    export, calibrated on `calibration`'s chips (`landcover.prediction.backends.quantize`)."""
    problem = int8_choice_problem(
        backend=backend, precision="int8", calibration=calibration, adapting=False
    )
    if problem is not None:
        raise PredictionError(problem)
    if kind != "model":
        raise PredictionError(
            f"--precision int8 quantizes a model file (model.pt), not {url} (an exported "
            f"{kind} file); predict with its model.pt"
        )
    try:
        require_onnx_installed("onnxruntime", "onnxscript")
        onnx = require_onnx("onnx")
        path, digest = cached_onnx(url, storage_options=storage_options)
    except ExportError as exc:
        raise PredictionError(f"--precision int8: {exc}; or use --precision fp32") from None
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    sample = calibration_sample(
        calibration,
        meta_from_onnx_props(props, str(path)),
        model=url,
        storage_options=storage_options,
    )
    model, meta = onnx_model(str(cached_int8(path, digest, sample)), device, None, digest=digest)
    if not isinstance(model, OnnxWindowModel):
        raise TypeError(f"an int8 model runs on onnxruntime, not {type(model).__name__}")  # a bug
    ran = model.inference
    model.inference = QuantizedInference(
        ran.backend, "int8", ran.provider, sample.store, sample.digest
    )
    return model, meta


def _module_device(module: nn.Module) -> torch.device:
    first = next(iter(module.parameters()), None)
    return first.device if first is not None else torch.device("cpu")
