"""`EvaluateConfig`: what an evaluation compares, and the one definition of the options of
`landcover evaluate` that the library reads.

Each field that is an option declares its flag and help (`tiling.runtime.flags`); the command
generates those click options from it and builds the config from the parsed values. Values
no evaluation can use are refused here, in the constructor (one line). Free of rasterio and
torch, so that the command's options are known without importing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from landcover.errors import EvaluationError
from tiling.runtime.flags import flag, option

__all__ = ["EvaluateConfig"]


@dataclass(frozen=True, slots=True)
class EvaluateConfig:
    """Everything `evaluate_prediction` needs; built by the CLI."""

    prediction: str = field(metadata=flag("PREDICTION"))
    truth: tuple[str, ...] = option(
        "--truth",
        (),
        "Truth raster(s) covering the map: paths, globs or URLs; repeat the option for several.",
    )
    # a labelled sample instead of wall-to-wall truth (landcover.evaluation.samplecompare)
    reference: str | None = option(
        "--reference",
        None,
        "A labelled sample of the map (the .gpkg or .csv of `landcover sample`, its reference "
        "column filled): area estimates with 95 % CIs and accuracies with standard errors "
        "(Olofsson et al. 2014) instead of --truth.",
    )
    reference_raster: str | None = option(
        "--reference-raster",
        None,
        "With --reference: read each point's reference from this truth raster (remapped with "
        "--class-map) instead of the sample's reference column.",
    )
    # remap of the truth's raw codes; None: the prediction's
    class_map: str | None = option(
        "--class-map",
        None,
        "Remap of the truth's raw codes [default: the prediction's class map].",
    )
    block_px: int = 2048
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag("--storage-options")
    )

    def __post_init__(self) -> None:
        if not self.truth and self.reference is None:
            raise EvaluationError(
                "nothing to score against: give --truth RASTER (wall-to-wall truth) or "
                "--reference SAMPLE (a labelled `landcover sample`)"
            )
        if self.truth and self.reference is not None:
            raise EvaluationError(
                "--truth and --reference are two ways to score a map; give one of them"
            )
        if self.reference_raster is not None and self.reference is None:
            raise EvaluationError(
                "--reference-raster labels the points of a sample: add --reference SAMPLE"
            )
        if self.block_px < 1:
            raise EvaluationError(f"block size {self.block_px} px: must be positive")
