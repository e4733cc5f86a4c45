"""What runs a prediction's model, as recorded in its outputs: `Inference` (backend,
precision, provider) and, for an int8 model, `QuantizedInference` (the calibration too). The
outputs' tags come from `tags()` (`landcover.prediction.intofile`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TAG_BACKEND",
    "TAG_CALIBRATION",
    "TAG_CALIBRATION_SHA256",
    "TAG_PRECISION",
    "TAG_PROVIDER",
    "Inference",
    "QuantizedInference",
]

TAG_BACKEND = "LANDCOVER_BACKEND"
TAG_PRECISION = "LANDCOVER_PRECISION"
TAG_PROVIDER = "LANDCOVER_PROVIDER"
TAG_CALIBRATION = "LANDCOVER_CALIBRATION"
TAG_CALIBRATION_SHA256 = "LANDCOVER_CALIBRATION_SHA256"


@dataclass(frozen=True, slots=True)
class Inference:
    """What runs a model: the backend, the precision and where (torch's device, or the
    onnxruntime providers). Written into the outputs' tags (`tags`)."""

    backend: str  # torch | onnxruntime
    precision: str  # fp32 | bf16 | int8
    provider: str  # e.g. "cpu", "cuda:0", "CPUExecutionProvider"

    def tags(self) -> dict[str, str]:
        """The GeoTIFF tags that record what ran."""
        return {
            TAG_BACKEND: self.backend,
            TAG_PRECISION: self.precision,
            TAG_PROVIDER: self.provider,
        }


@dataclass(frozen=True, slots=True)
class QuantizedInference(Inference):
    """What runs an int8 model, and the chip store and sample it was calibrated on (both in
    the tags; `landcover.prediction.backends.calibration`)."""

    calibration: str  # the store's URL
    calibration_sha256: str

    def tags(self) -> dict[str, str]:
        return {
            **Inference.tags(self),
            TAG_CALIBRATION: self.calibration,
            TAG_CALIBRATION_SHA256: self.calibration_sha256,
        }
