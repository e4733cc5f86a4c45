"""Model registry: a plain dict of name → builder, and one factory.

Every model takes `in_channels` bands (R, G, B, NIR by default) and returns logits
(B, num_classes, H, W) as a Tensor for any H, W. `small_unet` is in `landcover.models.unet`,
the smp models (`unet_resnet*`, and every `smp:ARCH:ENCODER` name besides the registered
ones) in `landcover.models.smp_models`, torchvision's segmentation models in
`landcover.models.segmentation`, the 4-band stems and pretrained weights
(`pretrained="imagenet"` or a weights file) in `landcover.models.pretrained`.

torchvision is imported by the builders that need it, not with this module: importing
`torchvision.models` takes seconds, paid by every DDP worker, and `small_unet` (and
`available()`) need none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from landcover.errors import TrainingError, UnknownModelError
from landcover.models.segmentation import (
    build_lraspp_mobilenet_v3_large,
    build_resnet50_segmentation,
)
from landcover.models.smp_models import (
    SMP_PREFIX,
    build_smp_model,
    build_unet_resnet,
    is_smp_name,
    parse_smp_name,
)
from landcover.models.unet import build_small_unet

__all__ = ["DEFAULT_MODEL", "ModelBuilder", "available", "build_model", "check_model_name"]

ModelBuilder = Callable[[int, int, str | None], nn.Module]
"""(in_channels, num_classes, pretrained) -> model."""

_REGISTRY: dict[str, ModelBuilder] = {
    "small_unet": build_small_unet,
    "unet_resnet18": partial(build_unet_resnet, "unet_resnet18", 18),
    "unet_resnet34": partial(build_unet_resnet, "unet_resnet34", 34),
    "unet_resnet50": partial(build_unet_resnet, "unet_resnet50", 50),
    "deeplabv3_resnet50": partial(build_resnet50_segmentation, "deeplabv3_resnet50"),
    "fcn_resnet50": partial(build_resnet50_segmentation, "fcn_resnet50"),
    "lraspp_mobilenet_v3_large": build_lraspp_mobilenet_v3_large,
}

DEFAULT_MODEL = "small_unet"


def available() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_REGISTRY)


def _choose_one() -> str:
    return (
        f"choose one of: {', '.join(available())}, or {SMP_PREFIX}ARCH:ENCODER "
        "(`landcover models` lists them)"
    )


def check_model_name(name: str) -> ModelBuilder:
    """The builder of model `name` (a registered name or `smp:ARCH:ENCODER`);
    UnknownModelError listing `available()` if none. The one place a model name is parsed: a
    name with spaces around it is refused, not stripped, since it is stored as given (run.json,
    model.pt's `architecture`) and must name the model as every later reader parses it."""
    if name != name.strip():
        raise UnknownModelError(
            f"unknown model {name!r}: a model name has no spaces around it, write "
            f"{name.strip()!r}; {_choose_one()}"
        )
    if is_smp_name(name):
        parse_smp_name(name)
        return partial(build_smp_model, name)
    builder = _REGISTRY.get(name)
    if builder is None:
        raise UnknownModelError(f"unknown model {name!r}; {_choose_one()}")
    return builder


def build_model(
    name: str, *, in_channels: int = 4, num_classes: int, pretrained: str | None = None
) -> nn.Module:
    """Build a registered model; forward maps (B, in_channels, H, W) to (B, num_classes, H, W)."""
    builder = check_model_name(name)
    if in_channels < 1:
        raise TrainingError(f"in_channels={in_channels}: a model needs at least one input band")
    if num_classes < 1:
        raise TrainingError(f"num_classes={num_classes}: a model needs at least one class")
    return builder(in_channels, num_classes, pretrained)
