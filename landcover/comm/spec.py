"""Gradient compression modes (`--compression`): `CompressionSpec` and its parser.

No torch import: `TrainConfig` checks `--compression` before any worker (or torch) starts. The
hooks that carry out each mode are installed by `landcover.comm.hooks.install_comm_hook`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

from landcover.errors import TrainingError

__all__ = ["COMPRESSION_FORMS", "COMPRESSION_KINDS", "CompressionSpec", "parse_compression"]

CompressionKind = Literal["none", "fp16", "bf16", "powersgd", "onebit"]
COMPRESSION_KINDS: tuple[str, ...] = get_args(CompressionKind)
COMPRESSION_FORMS = "none, fp16, bf16, powersgd[:RANK] (e.g. powersgd:4), onebit"


@dataclass(frozen=True, slots=True)
class CompressionSpec:
    """A gradient compression mode. `rank` and `start_iter` matter for PowerSGD only;
    `error_feedback=False` (onebit only) is the plain scaled-sign baseline, for comparison."""

    kind: CompressionKind = "none"
    rank: int = 2
    start_iter: int = 2
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSION_KINDS:
            raise TrainingError(f"compression {self.kind!r} is not known; use {COMPRESSION_FORMS}")
        if self.rank < 1:
            raise TrainingError(f"PowerSGD rank {self.rank} must be a positive integer")
        if self.start_iter < 2:
            raise TrainingError(
                f"PowerSGD start_iter {self.start_iter} must be >= 2: DDP rebuilds its buckets "
                "after the first step"
            )

    def __str__(self) -> str:
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        if self.kind == "onebit" and not self.error_feedback:
            return "onebit-no-ef"
        return self.kind


def parse_compression(text: str) -> CompressionSpec:
    """Parse `--compression`: none | fp16 | bf16 | powersgd[:RANK] | onebit."""
    value = text.strip().lower()
    kind, sep, rank_text = value.partition(":")
    if kind == "powersgd":
        if not sep:
            return CompressionSpec("powersgd")
        if rank_text.isdigit() and int(rank_text) >= 1:
            return CompressionSpec("powersgd", rank=int(rank_text))
    elif not sep and kind in COMPRESSION_KINDS:
        return CompressionSpec(cast(CompressionKind, kind))
    raise TrainingError(f"--compression {text!r} is not valid; use one of: {COMPRESSION_FORMS}")
