"""int8 models made once from a model's fp32 ONNX export by onnxruntime's static quantization,
cached by what they are made of.

`predict --precision int8` runs a `model.pt` through `cached_int8(...)`: its fp32 export
(`landcover.prediction.backends.onnxcache`) quantized by `onnxruntime.quantization.
quantize_static`, with the activations' ranges calibrated on a fixed sample of chips
(`landcover.prediction.backends.calibration`). Quantizing runs the fp32 model over the sample
(seconds), so the file is made once and found again by every later run, rank, tile and task:

- its key is the SHA-256 of (the model file's digest, the sample's digest, onnxruntime's
  version, `SCHEME`): another model, another sample (a changed store, other band statistics)
  or another onnxruntime (other kernels and calibrator) is another file;
- it lies in the user's cache, `$XDG_CACHE_HOME/landcover/int8/<key>.onnx`, and records its key
  in its metadata (after the model's own, which quantizing keeps): a file is used only when
  it reads as ONNX and records that key, so a file cut short (its metadata is serialised
  last) or replaced is quantized again, never trusted;
- it is written atomically (a temp file renamed into place) by one process at a time on a
  machine (an flock per key, as for the export), so ranks started together wait for the first
  one's file instead of each quantizing. quantize_static gives the same bytes for the same
  inputs, so two machines that miss each other's lock write the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.errors import PredictionError, reason
from landcover.models.export import require_onnx
from landcover.prediction.backends.calibration import CalibrationSample
from landcover.prediction.backends.onnxcache import cache_dir, machine_lock
from landcover.prediction.choices import CALIBRATION_BATCH

__all__ = ["INT8_KEY_PROP", "SCHEME", "cached_int8", "int8_cache_path", "int8_key", "recorded_key"]

logger = logging.getLogger(__name__)

INT8_KEY_PROP = "landcover_int8_key"
# The quantization recipe below, versioned: a change of it must not find the older files.
SCHEME = "qdq-s8s8-perchannel-minmax-1"


def int8_key(model_digest: str, sample_digest: str) -> str:
    """The key of the int8 model of the model file of `model_digest` calibrated on the sample
    of `sample_digest` by the installed onnxruntime."""
    ort = require_onnx("onnxruntime")
    text = f"{model_digest}:{sample_digest}:onnxruntime {ort.__version__}:{SCHEME}"
    return hashlib.sha256(text.encode()).hexdigest()


def int8_cache_path(key: str) -> Path:
    """Where the int8 model of `key` is cached (the user's cache)."""
    return cache_dir().parent / "int8" / f"{key}.onnx"


def recorded_key(path: Path) -> str | None:
    """The key an int8 file records; None when there is no file, it is not readable ONNX
    (cut short, damaged), or it records none."""
    if not path.is_file():
        return None
    onnx = require_onnx("onnx")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError and onnx's own errors: not usable
        return None
    return {p.key: p.value for p in proto.metadata_props}.get(INT8_KEY_PROP) or None


def cached_int8(fp32_onnx: Path, model_digest: str, sample: CalibrationSample) -> Path:
    """The path of the int8 model of the fp32 ONNX file `fp32_onnx` (the export of the model
    file of `model_digest`) calibrated on `sample`: the cached file when it records its key,
    else a new one (see the module docstring). `PredictionError` in one line when it cannot
    be cached or onnxruntime cannot quantize the model."""
    key = int8_key(model_digest, sample.digest)
    path = int8_cache_path(key)
    if recorded_key(path) == key:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PredictionError(
            f"--precision int8: cannot cache the quantized model in {path.parent} "
            f"({exc.strerror}); set XDG_CACHE_HOME to a writable directory, or use --precision "
            "fp32"
        ) from None
    with machine_lock(f"int8-{key[:32]}"):
        if recorded_key(path) == key:  # another process quantized it meanwhile
            return path
        started = time.perf_counter()
        logger.info("quantizing %s to int8 once (cached as %s)", fp32_onnx.name, path)
        _quantize_atomically(fp32_onnx, path, sample, key)
        logger.info("quantized in %.1f s", time.perf_counter() - started)
    return path


def _quantize_atomically(fp32_onnx: Path, path: Path, sample: CalibrationSample, key: str) -> None:
    """Write the int8 model of `fp32_onnx` at `path`, recording `key`: quantized into a temp
    file beside it, renamed into place once whole."""
    onnx = require_onnx("onnx")
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=".tmp")
    except OSError as exc:  # a cache directory this user cannot write
        raise _cannot_write(path, exc) from None
    os.close(fd)
    temp = Path(name)
    try:
        _quantize(fp32_onnx, temp, sample)
        proto = onnx.load(str(temp))
        props = {p.key: p.value for p in proto.metadata_props}
        onnx.helper.set_model_props(proto, {**props, INT8_KEY_PROP: key})
        onnx.save(proto, str(temp))
        try:
            os.replace(temp, path)
        except OSError as exc:  # a directory in the file's place
            raise _cannot_write(path, exc) from None
    finally:
        temp.unlink(missing_ok=True)


def _cannot_write(path: Path, exc: OSError) -> PredictionError:
    """The one line for an int8 file that cannot be written at `path`."""
    return PredictionError(
        f"--precision int8: cannot write the quantized model {path} ({exc.strerror}); remove "
        "what is there or set XDG_CACHE_HOME to a writable directory, or use --precision fp32"
    )


def _quantize(fp32_onnx: Path, out: Path, sample: CalibrationSample) -> None:
    """onnxruntime's static quantization of `fp32_onnx` into `out`, calibrated on `sample`.

    The recipe (`SCHEME`), as onnxruntime's quantization guide recommends for CPUs:
    - QDQ format with signed int8 activations and weights (S8S8; quantize_static's defaults):
      the guide's first choice on x86-64, fused by the CPU provider into its int8 kernels;
      QOperator with S8S8 is slow there;
    - weights per channel: a convolution's output channels differ in range by orders of
      magnitude, one scale for all of them would round the small ones to a few levels;
    - reduce_range off: 7-bit weights only help CPUs without VNNI, whose u8 x s8 kernels
      saturate; `--precision int8` is refused on those (`CpuFeatures.int8`);
    - MinMax calibration (the default): one pass, deterministic, no histogram to bin;
      `CalibStridedMinMax` computes and merges the ranges batch by batch, so memory holds one
      batch's activations rather than the whole sample's (its `CalibMaxIntermediateOutputs`
      drops the batches it should reduce, onnxruntime 1.32);
    - no `quant_pre_process`: its symbolic shape inference fails on the dynamo exporter's
      graphs of these models, and the exporter already folds constants and BatchNorm.
    """
    quantization = require_onnx("onnxruntime.quantization")
    onnx = require_onnx("onnx")
    input_name = onnx.load(str(fp32_onnx), load_external_data=False).graph.input[0].name
    reader = _SampleReader(input_name, sample.chips)
    try:
        with _quiet_advice():
            quantization.quantize_static(
                str(fp32_onnx),
                str(out),
                reader,
                quant_format=quantization.QuantFormat.QDQ,
                per_channel=True,
                reduce_range=False,
                activation_type=quantization.QuantType.QInt8,
                weight_type=quantization.QuantType.QInt8,
                calibrate_method=quantization.CalibrationMethod.MinMax,
                calibration_providers=["CPUExecutionProvider"],
                extra_options={"CalibStridedMinMax": 1},
            )
    except Exception as exc:  # onnxruntime's quantizer raises untyped errors
        raise PredictionError(
            f"--precision int8: onnxruntime could not quantize {fp32_onnx.name} "
            f"({' '.join(reason(exc).split())[:200]}); use --precision fp32"
        ) from None


class _SampleReader:
    """The calibration sample as onnxruntime's `CalibrationDataReader`, in batches of
    CALIBRATION_BATCH chips; `set_range` selects batches (`CalibStridedMinMax`)."""

    def __init__(self, input_name: str, chips: npt.NDArray[np.float32]) -> None:
        self.input_name = input_name
        self.batches = [
            np.ascontiguousarray(chips[i : i + CALIBRATION_BATCH])
            for i in range(0, len(chips), CALIBRATION_BATCH)
        ]
        self.pending: Iterator[npt.NDArray[np.float32]] = iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.pending = iter(self.batches[start_index:end_index])

    def get_next(self) -> dict[str, Any] | None:
        batch = next(self.pending, None)
        return None if batch is None else {self.input_name: batch}


@contextlib.contextmanager
def _quiet_advice() -> Iterator[None]:
    """Drop the quantizer's advice to pre-process (logged on the root logger at WARNING on
    every call: `_quantize` says why it does not)."""

    def keep(record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
