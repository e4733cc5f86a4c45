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
  rank, tile and task of a job decides the same); torch on other devices and for bf16.

The precision (`--precision`): fp32, or bf16 through torch's autocast where the hardware has
native bf16 (a CPU with AVX-512 BF16 or AMX, `landcover.prediction.backends.cpu`; a CUDA GPU
that supports it); refused in one line elsewhere and with onnxruntime. `auto` is fp32.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import fsspec
import torch
from torch import nn

from landcover.errors import ExportError, ModelFileError, PredictionError
from landcover.models.export import (
    EXPORT_SOURCE,
    load_torchscript,
    meta_from_onnx_props,
    model_kind,
    onnx_model_digest,
    require_onnx,
)
from landcover.models.modelfile import ModelMeta, load_model_file
from landcover.prediction.backends.cpu import cpu_features
from landcover.prediction.backends.onnxcache import cached_onnx
from landcover.prediction.choices import (
    AUTO_ONNX_MIN_WINDOW_PIXELS,
    BACKENDS,
    PRECISIONS,
    Backend,
    Precision,
)

if TYPE_CHECKING:
    from landcover.prediction.config import PredictConfig

__all__ = [
    "CPU_MIN_BATCH",
    "BackendModel",
    "Inference",
    "OnnxWindowModel",
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

TAG_BACKEND = "LANDCOVER_BACKEND"
TAG_PRECISION = "LANDCOVER_PRECISION"
TAG_PROVIDER = "LANDCOVER_PROVIDER"


class WindowModel(Protocol):
    """Logits (n, classes, h, w) for normalised pixels (n, bands, h, w), on their device."""

    def __call__(self, pixels: torch.Tensor) -> Any: ...


@dataclass(frozen=True, slots=True)
class Inference:
    """What runs a model: the backend, the precision and where (torch's device, or the
    onnxruntime providers). Written into the outputs' tags (`tags`)."""

    backend: str  # torch | onnxruntime
    precision: str  # fp32 | bf16
    provider: str  # e.g. "cpu", "cuda:0", "CPUExecutionProvider"

    def tags(self) -> dict[str, str]:
        """The GeoTIFF tags that record what ran."""
        return {
            TAG_BACKEND: self.backend,
            TAG_PRECISION: self.precision,
            TAG_PROVIDER: self.provider,
        }


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
    `onnx`: for `auto` on a model file, makes the onnxruntime model `for_prediction` switches
    to for a large prediction; None otherwise.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        device: torch.device | None = None,
        precision: str = "fp32",
        onnx: Callable[[], BackendModel] | None = None,
    ) -> None:
        self.module = module
        self.precision = precision
        self.onnx = onnx
        self.device = device or _module_device(module)
        self.inference = Inference("torch", precision, str(self.device))

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
    hardware has native bf16, else `PredictionError` in one line."""
    if precision not in PRECISIONS:
        raise PredictionError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision in ("auto", "fp32"):
        return "fp32"
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
) -> tuple[BackendModel, ModelMeta]:
    """The model of `url` run by `backend` in `precision` (see the module docstring) and its
    metadata. Under `auto` a model file runs with torch until `for_prediction` sizes it."""
    if backend not in BACKENDS:
        raise PredictionError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    numbers = resolve_precision(precision, device)
    kind = model_kind(url, storage_options=storage_options)
    if backend == "auto" and kind != "model":
        backend = "onnxruntime" if kind == "onnx" else "torch"
    if backend == "onnxruntime":
        if numbers != "fp32":
            raise PredictionError(
                f"--precision {precision} runs with --backend torch; onnxruntime runs fp32 "
                "here (drop --precision or use --backend torch)"
            )
        if kind == "torchscript":  # export takes model.pt files only
            raise PredictionError(
                f"--backend onnxruntime runs ONNX files and model files, not {url} (a "
                f"TorchScript file); run it with --backend torch, or export {EXPORT_SOURCE} "
                "with `landcover export RUN_DIR/model.pt --format onnx --out model.onnx`"
            )
        if kind == "onnx":
            return _onnx_model(url, device, storage_options)
        return _exported_model(url, device, storage_options, auto=False)
    if kind == "onnx":
        raise PredictionError(f"{url} is an ONNX file; use --backend onnxruntime (or auto)")
    if kind == "torchscript":
        module, meta = load_torchscript(url, device=device, storage_options=storage_options)
        return TorchWindowModel(module, device=device, precision=numbers), meta
    module, meta = load_model_file(url, device=device, storage_options=storage_options)
    onnx = None
    if backend == "auto" and device.type == "cpu" and numbers == "fp32" and _onnx_installed():
        onnx = _deferred_export(url, device, storage_options)
    return TorchWindowModel(module, device=device, precision=numbers, onnx=onnx), meta


def for_prediction(model: BackendModel, window_pixels: int) -> BackendModel:
    """The model to run a prediction whose windows hold `window_pixels` pixels in all (the
    whole grid's, so that every rank and tile decides alike): under `auto`, a model file's
    onnxruntime export from `AUTO_ONNX_MIN_WINDOW_PIXELS` on, else `model` itself. An export
    that fails under `auto` is a warning, and torch runs the model."""
    onnx = model.onnx if isinstance(model, TorchWindowModel) else None
    if onnx is None or window_pixels < auto_onnx_min_window_pixels():
        return model
    try:
        return onnx()
    except ExportError as exc:
        logger.warning("%s; running the model with torch (--backend torch)", exc)
        return model


def auto_onnx_min_window_pixels() -> int:
    """`AUTO_ONNX_MIN_WINDOW_PIXELS` (a function, so that a test can lower it)."""
    return AUTO_ONNX_MIN_WINDOW_PIXELS


def with_inference(config: PredictConfig, model: BackendModel) -> PredictConfig:
    """`config` (a `PredictConfig`) with the backend and precision that run `model`, so that
    what a part or tile's key records is what ran, not `auto`."""
    ran = model.inference
    return replace(
        config, backend=cast(Backend, ran.backend), precision=cast(Precision, ran.precision)
    )


def _onnx_installed() -> bool:
    try:
        for module in ("onnxruntime", "onnx", "onnxscript"):
            require_onnx(module)
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
        require_onnx("onnxruntime")
        for module in ("onnx", "onnxscript"):
            require_onnx(module)
        path, digest = cached_onnx(url, storage_options=storage_options)
    except ExportError as exc:
        if auto:
            raise
        raise PredictionError(f"--backend onnxruntime: {exc}; or use --backend torch") from None
    model, meta = _onnx_model(str(path), device, None, digest=digest)
    logger.info("running %s through its ONNX export %s", url, path)
    return model, meta


def _onnx_model(
    url: str,
    device: torch.device,
    storage_options: Mapping[str, Any] | None,
    *,
    digest: str | None = None,
) -> tuple[BackendModel, ModelMeta]:
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


def _module_device(module: nn.Module) -> torch.device:
    first = next(iter(module.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


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
