"""CompressionSpec: `--compression` parsed once into a mode and its parameters."""

from __future__ import annotations

import pytest

from landcover.comm.spec import CompressionMode, CompressionSpec, label_mode, parse_compression
from landcover.errors import TrainingError


@pytest.mark.parametrize("text", ["none", "NONE", " None "])
def test_every_spelling_of_none_compresses_nothing(text: str) -> None:
    spec = parse_compression(text)
    assert spec.kind is CompressionMode.NONE and not spec.compresses and str(spec) == "none"


@pytest.mark.parametrize("text", ["fp16", "BF16", "powersgd", "powersgd:4", "onebit"])
def test_a_compressing_mode_says_so(text: str) -> None:
    assert parse_compression(text).compresses


def test_a_kind_given_as_text_is_held_as_its_mode() -> None:
    spec = CompressionSpec("fp16")  # type: ignore[arg-type]
    assert spec.kind is CompressionMode.FP16 and spec == CompressionSpec(CompressionMode.FP16)
    with pytest.raises(TrainingError, match=r"^compression 'fp8' is not known; use none, "):
        CompressionSpec("fp8")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "mode"),
    [
        ("none", CompressionMode.NONE),
        ("powersgd:2", CompressionMode.POWERSGD),
        ("onebit", CompressionMode.ONEBIT),
        ("onebit-no-ef", CompressionMode.ONEBIT),  # str() of onebit without error feedback
        ("zstd", None),
    ],
)
def test_a_metrics_label_gives_its_mode(label: str, mode: CompressionMode | None) -> None:
    assert label_mode(label) is mode
