"""`--adapt`: which test-time adaptation a prediction applies, and how strongly; free of torch
and GDAL, so that the CLI's option and the config's check read it without importing them.

A value is `METHOD` or `METHOD:STRENGTH` (`landcover.prediction.adapt` computes and applies it):

- `none`: the model as trained;
- `bands`: per-run band normalisation: the band means and standard deviations of the target
  images (a fixed lattice of windows over the region) replace the training ones the model
  normalises pixels with, mixed as `(1 - s) * training + s * target`. The chip store records
  per-band means and standard deviations only, so this is also the histogram matching the
  store's statistics allow (the first two moments);
- `bn`: AdaBN: every BatchNorm layer's running mean and variance become
  `(1 - s) * training + s * target`, the target's measured on the same windows, layer after
  layer (each layer sees the previous layers already adapted);
- `bn-early`: `bn` on the first `EARLY_BN_LAYERS` BatchNorm layers of the forward pass only;
- `bn+bands`: `bands`, then `bn` on the pixels so normalised.

STRENGTH `s` is in [0, 1] (0 is the model as trained; 1 replaces the training statistics);
without it, the method's `DEFAULT_STRENGTHS` value. `benchmarks/bench_adapt.py` measures the
methods and strengths on shifted held-out imagery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from landcover.errors import PredictionError

__all__ = [
    "ADAPT_METHODS",
    "DEFAULT_ADAPT",
    "DEFAULT_STRENGTHS",
    "EARLY_BN_LAYERS",
    "TAG_ADAPT",
    "TAG_ADAPT_BANDS",
    "TAG_ADAPT_SHA256",
    "AdaptSpec",
    "parse_adapt",
]

ADAPT_METHODS: tuple[str, ...] = ("none", "bands", "bn", "bn-early", "bn+bands")
# The strength of each method without `:STRENGTH`. Fully replacing the BatchNorm statistics
# with the target's (naive AdaBN, strength 1) lowered a held-out tile's accuracy (issue 44).
DEFAULT_STRENGTHS: Mapping[str, float] = {
    "none": 0.0,
    "bands": 0.5,
    "bn": 0.5,
    "bn-early": 1.0,
    "bn+bands": 0.5,
}
EARLY_BN_LAYERS = 2  # `bn-early`: the stem's (or first block's) BatchNorm layers
# The output's tags (GeoTIFF; STAC item properties `landcover:adapt`, `landcover:adapt_sha256`):
# the method, the SHA-256 of all its statistics, and the band statistics the windows got.
TAG_ADAPT = "LANDCOVER_ADAPT"
TAG_ADAPT_SHA256 = "LANDCOVER_ADAPT_SHA256"
TAG_ADAPT_BANDS = "LANDCOVER_ADAPT_BANDS"
# What `--adapt` is without a value: `benchmarks/bench_adapt.py` decides (docs/guide/predict.md)
DEFAULT_ADAPT = "none"


@dataclass(frozen=True, slots=True)
class AdaptSpec:
    """An `--adapt` value: the method and its strength in [0, 1]."""

    method: str
    strength: float

    @property
    def active(self) -> bool:
        """Whether the adaptation changes anything (not `none`, strength above 0)."""
        return self.method != "none" and self.strength > 0

    @property
    def uses_bn(self) -> bool:
        return self.active and self.method in ("bn", "bn-early", "bn+bands")

    @property
    def uses_bands(self) -> bool:
        return self.active and self.method in ("bands", "bn+bands")

    def __str__(self) -> str:
        """The canonical text (`none`, or `METHOD:STRENGTH`)."""
        return "none" if self.method == "none" else f"{self.method}:{self.strength:g}"


def parse_adapt(text: str) -> AdaptSpec:
    """The `AdaptSpec` of an `--adapt` value; `PredictionError` in one line for a bad one. A
    suffix `@DIGEST` (what a run records once the statistics are computed) is ignored."""
    value = text.split("@", 1)[0].strip()
    method, _, strength_text = value.partition(":")
    if method not in ADAPT_METHODS:
        raise PredictionError(
            f"--adapt {text!r}: choose one of {', '.join(ADAPT_METHODS)}, optionally with a "
            "strength in [0, 1] after a colon (e.g. --adapt bn:0.5)"
        )
    if not strength_text:
        return AdaptSpec(method, DEFAULT_STRENGTHS[method])
    try:
        strength = float(strength_text)
    except ValueError:
        strength = math.nan
    if not 0.0 <= strength <= 1.0 or method == "none":
        raise PredictionError(
            f"--adapt {text!r}: the strength after the colon must be a number in [0, 1] "
            f"(e.g. --adapt {method if method != 'none' else 'bn'}:0.5)"
        )
    return AdaptSpec(method, strength)
