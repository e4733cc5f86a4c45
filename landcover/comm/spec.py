"""Gradient compression modes (`--compression`): `CompressionMode`, `CompressionSpec` and its
parser, the one place where the flag's text is read.

`--compression` is parsed once, where the command line (or the API) gives it: `TrainConfig`
holds a `CompressionSpec`, and everything downstream (the sync strategy, the comm hook, the
metrics label) reads its attributes. No torch import: `TrainConfig` checks `--compression`
before any worker (or torch) starts. The hooks that carry out each mode are installed by
`landcover.comm.hooks.install_comm_hook`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from landcover.errors import TrainingError

__all__ = [
    "COMPRESSION_FORMS",
    "COMPRESSION_KINDS",
    "CompressionMode",
    "CompressionSpec",
    "label_mode",
    "parse_compression",
]


class CompressionMode(enum.StrEnum):
    """How DDP's gradient buckets travel: plain all-reduce (`NONE`) or compressed."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    ONEBIT = "onebit"


COMPRESSION_KINDS: tuple[str, ...] = tuple(m.value for m in CompressionMode)
COMPRESSION_FORMS = "none, fp16, bf16, powersgd[:RANK] (e.g. powersgd:4), onebit"
_NO_EF_SUFFIX = "-no-ef"  # the label of onebit without error feedback


@dataclass(frozen=True, slots=True)
class CompressionSpec:
    """A gradient compression mode. `rank` and `start_iter` matter for PowerSGD only;
    `error_feedback=False` (onebit only) is the plain scaled-sign baseline, for comparison.
    `kind` may be given as text ("fp16"); it is held as a `CompressionMode`."""

    kind: CompressionMode = CompressionMode.NONE
    rank: int = 2
    start_iter: int = 2
    error_feedback: bool = True

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", CompressionMode(self.kind))
        except ValueError:
            raise TrainingError(
                f"compression {self.kind!r} is not known; use {COMPRESSION_FORMS}"
            ) from None
        if self.rank < 1:
            raise TrainingError(f"PowerSGD rank {self.rank} must be a positive integer")
        if self.start_iter < 2:
            raise TrainingError(
                f"PowerSGD start_iter {self.start_iter} must be >= 2: DDP rebuilds its buckets "
                "after the first step"
            )

    @property
    def compresses(self) -> bool:
        """Whether the gradients are compressed (anything but the plain all-reduce)."""
        return self.kind is not CompressionMode.NONE

    def __str__(self) -> str:
        """The canonical text: what `parse_compression` reads back, and metrics.jsonl's label
        (`onebit-no-ef` for the baseline without error feedback, which no flag gives)."""
        if self.kind is CompressionMode.POWERSGD:
            return f"powersgd:{self.rank}"
        if self.kind is CompressionMode.ONEBIT and not self.error_feedback:
            return CompressionMode.ONEBIT.value + _NO_EF_SUFFIX
        return self.kind.value

    @classmethod
    def parse(cls, text: str) -> CompressionSpec:
        """`parse_compression` (the option's parser in `TrainConfig`)."""
        return parse_compression(text)


def parse_compression(text: str) -> CompressionSpec:
    """Parse `--compression`: none | fp16 | bf16 | powersgd[:RANK] | onebit (any case)."""
    value = text.strip().lower()
    kind, sep, rank_text = value.partition(":")
    if kind == CompressionMode.POWERSGD:
        if not sep:
            return CompressionSpec(CompressionMode.POWERSGD)
        if rank_text.isdigit() and int(rank_text) >= 1:
            return CompressionSpec(CompressionMode.POWERSGD, rank=int(rank_text))
    elif not sep and kind in COMPRESSION_KINDS:
        return CompressionSpec(CompressionMode(kind))
    raise TrainingError(f"--compression {text!r} is not valid; use one of: {COMPRESSION_FORMS}")


def label_mode(label: str) -> CompressionMode | None:
    """The mode of a metrics.jsonl `compression` label (`str(spec)`: "powersgd:2",
    "onebit-no-ef"); None for a label of no known mode."""
    kind = label.partition(":")[0].removesuffix(_NO_EF_SUFFIX)
    return CompressionMode(kind) if kind in COMPRESSION_KINDS else None
