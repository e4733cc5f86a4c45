"""What `landcover models` lists: the registered models and smp's architectures on a curated
set of encoders, each with its parameter count, and smp's encoder names.

Counts are for 4 bands and the default class table's classes. Models are built on the `meta`
device (shapes without memory or initialisation), so counting a few dozen takes seconds, not
the minutes that real weights would; smp's 800+ encoders are listed by name only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from landcover.errors import LandcoverError
from landcover.models.registry import available, build_model
from landcover.models.smp_models import (
    SMP_PREFIX,
    TIMM_PREFIX,
    architectures,
    encoder_names,
)
from tiling.sources.classes import DEFAULT_CLASS_MAP, get_class_map

__all__ = [
    "CURATED_ENCODERS",
    "CURATED_PAIRS",
    "TIMM_NOTE",
    "ModelEntry",
    "catalog",
    "count_parameters",
    "default_num_classes",
    "smp_encoders",
]

# Small to mid-size CNN encoders with smp ImageNet weights, listed on every architecture.
CURATED_ENCODERS = ("resnet18", "resnet34", "resnet50", "efficientnet-b0", "mobilenet_v2")
# Pairs listed besides: transformer encoders, with the architecture made for them.
CURATED_PAIRS = (("Segformer", "mit_b0"),)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model name `--model` takes, and its parameter count."""

    name: str
    kind: str  # "registered" or "smp"
    parameters: int


def default_num_classes() -> int:
    """Classes of the default class table (what `landcover tile` writes by default)."""
    return int(get_class_map(DEFAULT_CLASS_MAP).num_classes)


def count_parameters(name: str, *, in_channels: int = 4, num_classes: int | None = None) -> int:
    """Parameters of model `name`, built on the meta device (no memory, no initialisation), or
    on the CPU for a model whose construction reads tensor values (mit encoders)."""
    classes = default_num_classes() if num_classes is None else num_classes
    try:
        with torch.device("meta"):
            model = build_model(name, in_channels=in_channels, num_classes=classes)
    except LandcoverError as exc:
        if "meta" not in str(exc):  # it does not build at all
            raise
        model = build_model(name, in_channels=in_channels, num_classes=classes)
    return sum(p.numel() for p in model.parameters())


def catalog(*, in_channels: int = 4) -> list[ModelEntry]:
    """The registered models, then every smp architecture on each `CURATED_ENCODERS` encoder
    that it builds with (DPT needs a ViT encoder, for one), and `CURATED_PAIRS`, with
    parameter counts."""
    entries = [
        ModelEntry(name, "registered", count_parameters(name, in_channels=in_channels))
        for name in available()
    ]
    pairs = [(a, e) for a in architectures() for e in CURATED_ENCODERS] + list(CURATED_PAIRS)
    for arch, encoder in pairs:
        name = f"{SMP_PREFIX}{arch}:{encoder}"
        try:
            count = count_parameters(name, in_channels=in_channels)
        except LandcoverError:
            continue
        entries.append(ModelEntry(name, "smp", count))
    return entries


def smp_encoders() -> list[str]:
    """smp's own encoder names (`tu-NAME` takes any timm model besides)."""
    return encoder_names()


TIMM_NOTE = (
    f"{TIMM_PREFIX}NAME: any timm model (timm.list_models()), e.g. {TIMM_PREFIX}convnext_tiny"
)
