"""segmentation_models_pytorch (smp) architectures and encoders as registry models.

`smp:ARCH:ENCODER` builds smp's architecture ARCH (`Unet`, `UnetPlusPlus`, `FPN`,
`DeepLabV3Plus`, `Segformer`, ... matched without regard to case) on ENCODER: one of smp's own
encoders (`resnet34`, `efficientnet-b0`, `mit_b0`, ...) or `tu-NAME` for any timm model. The
model takes `in_channels` bands: smp builds the first convolution for them. With pretrained
weights, the weights' 3-band stem is widened by smp's own rule (`patch_first_conv`: band i
gets the filter of RGB band i mod 3, all scaled by 3 / bands), so NIR starts as red.

`unet_resnet18/34/50` are smp's `Unet` on `resnet18/34/50`: the same network as the U-Net this
package once wrote by hand, whose model files still load (their state-dict keys are renamed on
load, `_legacy_unet_key`). Their `imagenet` weights stay torchvision's, from the torch hub cache,
with the stem widened as `landcover.models.pretrained` documents.

Every model here pads its input up to a multiple of its encoder's output stride and crops the
logits back (`size_multiple`), so it takes any H, W as the registry promises; training refuses
chips that are not such a multiple (`check_chip_size`), which would train on padding.
segmentation_models_pytorch (and with it timm, torchvision) is imported by the builders only:
importing it takes seconds, which `small_unet` workers need not pay.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import nn

from landcover.errors import TrainingError, UnknownModelError
from landcover.models.pretrained import (
    ENCODER_FIX,
    EncoderWeights,
    check_encoder_fit,
    check_pretrained,
    encoder_tensors,
    hf_cached_file,
    imagenet_weights,
    load_encoder_state,
    pretrained_state,
    read_weights_file,
)
from landcover.models.unet import pad_to_multiple
from landcover.models.weightsource import IMAGENET

__all__ = [
    "SMP_PREFIX",
    "SmpPadding",
    "SmpSpec",
    "architectures",
    "build_smp_model",
    "build_unet_resnet",
    "check_chip_size",
    "encoder_names",
    "is_smp_name",
    "parse_smp_name",
]

logger = logging.getLogger(__name__)

SMP_PREFIX = "smp:"
TIMM_PREFIX = "tu-"
_EXAMPLE = "e.g. smp:Unet:resnet34"


@dataclass(frozen=True, slots=True)
class SmpSpec:
    """An smp model name parsed: the architecture (smp's class name) and the encoder."""

    arch: str
    encoder: str

    def __str__(self) -> str:
        return f"{SMP_PREFIX}{self.arch}:{self.encoder}"


def is_smp_name(name: str) -> bool:
    """Whether a model name asks for an smp model (`smp:...`)."""
    return name.startswith(SMP_PREFIX)


def architectures() -> list[str]:
    """smp's architectures (class names), in smp's order."""
    import segmentation_models_pytorch as smp

    return [cls.__name__ for cls in smp.MODEL_ARCHITECTURES_MAPPING.values()]


def encoder_names() -> list[str]:
    """smp's own encoders (timm models are `tu-NAME` besides these)."""
    import segmentation_models_pytorch as smp

    return list(smp.encoders.get_encoder_names())


def parse_smp_name(name: str) -> SmpSpec:
    """`smp:ARCH:ENCODER` as an SmpSpec; UnknownModelError naming the bad part and the fix."""
    parts = name.removeprefix(SMP_PREFIX).split(":")
    if len(parts) != 2 or not all(parts):
        raise UnknownModelError(
            f"{name!r} is not an smp model name; write smp:ARCH:ENCODER ({_EXAMPLE})"
        )
    arch_text, encoder = parts
    by_lower = {a.lower(): a for a in architectures()}
    arch = by_lower.get(arch_text.lower())
    if arch is None:
        raise UnknownModelError(
            f"{name}: smp has no architecture {arch_text!r}; choose one of: "
            + ", ".join(by_lower.values())
        )
    if not _is_encoder(encoder):
        close = difflib.get_close_matches(encoder, encoder_names(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UnknownModelError(
            f"{name}: smp has no encoder {encoder!r}{hint}; `landcover models --encoders` "
            f"lists them, and {TIMM_PREFIX}NAME takes any timm model"
        )
    return SmpSpec(arch, encoder)


def _is_encoder(encoder: str) -> bool:
    if encoder.startswith(TIMM_PREFIX):
        import timm

        # a pretrained tag (resnet18.a1_in1k) names weights, not another network
        return bool(timm.is_model(encoder.removeprefix(TIMM_PREFIX).split(".")[0]))
    return encoder in encoder_names()


class SmpPadding(nn.Module):
    """Put before an smp model class (`_padded_class`): pads the input up to `size_multiple`
    (the encoder's output stride) and crops the logits back, so any H, W works."""

    size_multiple: int = 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, height, width = pad_to_multiple(x, self.size_multiple)
        logits: torch.Tensor = super().forward(x)
        return logits[..., :height, :width]


@cache
def _padded_class(cls: type[nn.Module]) -> type[nn.Module]:
    """`cls` (an smp architecture) with `SmpPadding` in front, named like it."""
    return type(cls.__name__, (SmpPadding, cls), {"__module__": __name__})


def _build(
    spec: SmpSpec,
    in_channels: int,
    num_classes: int,
    model_name: str,
    encoder_state: EncoderWeights | None = None,
) -> nn.Module:
    """smp's `spec` with random weights, or `encoder_state` in its encoder."""
    import segmentation_models_pytorch as smp

    cls = _padded_class(smp.MODEL_ARCHITECTURES_MAPPING[spec.arch.lower()])
    try:
        model: Any = cls(
            encoder_name=spec.encoder,
            encoder_weights=None,
            in_channels=in_channels,
            classes=num_classes,
        )
    except (ValueError, KeyError, RuntimeError, TypeError, AttributeError) as exc:
        # e.g. DeepLabV3Plus on an encoder that cannot dilate, a ViT without features
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TrainingError(
            f"{model_name}: smp cannot build {spec.arch} on {spec.encoder} ({reason}); choose "
            "another encoder (`landcover models`)"
        ) from None
    model.size_multiple = int(model.encoder.output_stride)
    if encoder_state is not None:
        _load_smp_encoder(model.encoder, encoder_state, in_channels, model_name)
    assert isinstance(model, nn.Module)
    return model


def build_smp_model(
    name: str, in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    """The model of `smp:ARCH:ENCODER`, its encoder from `pretrained` (imagenet from the
    Hugging Face cache, or a weights file) when given."""
    spec = parse_smp_name(name)
    state = None
    if check_pretrained(name, pretrained, supported=True):
        assert pretrained is not None
        if pretrained == IMAGENET:
            state = _smp_imagenet_state(spec.encoder, name)
        else:
            state = encoder_tensors(EncoderWeights(read_weights_file(pretrained, name), pretrained))
    return _build(spec, in_channels, num_classes, name, state)


def _smp_imagenet_state(encoder: str, model_name: str) -> EncoderWeights:
    """smp's ImageNet weights of `encoder` from the Hugging Face cache (never downloaded)."""
    import segmentation_models_pytorch as smp

    entry = smp.encoders.encoders.get(encoder, {})
    settings = entry.get("pretrained_settings", {}).get(IMAGENET)
    if settings is None:
        where = (
            "timm's weights of a tu- encoder are not read from its cache"
            if encoder.startswith(TIMM_PREFIX)
            else f"smp has no ImageNet weights for {encoder}"
        )
        raise TrainingError(
            f"{model_name}: {where}; pass --pretrained PATH of the encoder's state dict "
            "(.pth, .safetensors)"
        )
    path = hf_cached_file(
        settings["repo_id"], "model.safetensors", settings["revision"], model_name
    )
    return EncoderWeights(read_weights_file(path, model_name), path)


def _load_smp_encoder(
    encoder: nn.Module, weights: EncoderWeights, in_channels: int, model_name: str
) -> None:
    """Load `weights` into an smp encoder built for `in_channels` bands: all of its tensors and
    no other encoder's (`check_encoder_fit`); a 3-band stem is widened by smp's
    `patch_first_conv`, a stem with `in_channels` bands loads as it is."""
    from segmentation_models_pytorch.encoders._utils import patch_first_conv

    state = weights.tensors
    own = encoder.state_dict()
    if own and all(k.startswith("model.") for k in own):  # a tu- encoder holds timm's model
        state = {k if k.startswith("model.") else f"model.{k}": v for k, v in state.items()}
    stem_name, stem = next((n, m) for n, m in encoder.named_modules() if isinstance(m, nn.Conv2d))
    stem_key = f"{stem_name}.weight"
    loaded = check_encoder_fit(
        own, state, model_name=model_name, source=weights.source, skip_shapes=(stem_key,)
    )
    stem_bands = int(loaded[stem_key].shape[1]) if loaded[stem_key].ndim == 4 else -1
    if stem_bands == 3 and in_channels != 3:
        rgb = nn.Conv2d(3, stem.out_channels, stem.kernel_size, bias=False)  # type: ignore[arg-type]
        rgb.weight = nn.Parameter(loaded[stem_key].clone())
        patch_first_conv(rgb, new_in_channels=in_channels, pretrained=True)
        loaded[stem_key] = rgb.weight.detach()
    if tuple(loaded[stem_key].shape) != tuple(own[stem_key].shape):
        raise TrainingError(
            f"{model_name}: the pretrained stem {stem_key} of {weights.source} has shape "
            f"{tuple(state[stem_key].shape)}; expected 3 or {in_channels} input bands; "
            f"{ENCODER_FIX}"
        )
    # strict: BatchNorm step counts an older file lacks are the only keys it may miss
    missing = {k: v for k, v in own.items() if k not in loaded}
    encoder.load_state_dict({**missing, **loaded})  # mit encoders take no `strict`
    logger.debug("%s: loaded %d encoder tensors", model_name, len(loaded))


def build_unet_resnet(
    name: str, depth: int, in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    """`unet_resnet<depth>`: smp's Unet on resnet<depth>, its encoder from torchvision's
    ImageNet weights (`imagenet`, torch hub cache) or a weights file; loads the state dicts of
    the hand-written U-Net it replaces."""
    use_weights = check_pretrained(name, pretrained, supported=True)
    model = _build(SmpSpec("Unet", f"resnet{depth}"), in_channels, num_classes, name)
    if use_weights:
        assert pretrained is not None
        state = pretrained_state(
            pretrained, name, lambda: imagenet_weights(f"ResNet{depth}_Weights", name)
        )
        encoder: Any = model.encoder
        load_encoder_state(
            encoder,
            encoder_tensors(state),
            stem_key="conv1.weight",
            in_channels=in_channels,
            model_name=name,
        )
    model.register_load_state_dict_pre_hook(_rename_legacy_unet_keys)  # type: ignore[no-untyped-call]
    return model


# The hand-written ResNet U-Net's decoder: decoder.<i>.block.<0|1>.<0 conv|1 bn> and head.
_LEGACY_DECODER_KEY = re.compile(r"decoder\.(\d+)\.block\.([01])\.")


def _legacy_unet_key(key: str) -> str:
    """A key of the hand-written U-Net as smp's Unet names it (other keys unchanged)."""
    match = _LEGACY_DECODER_KEY.match(key)
    if match:
        return f"decoder.blocks.{match[1]}.conv{int(match[2]) + 1}.{key[match.end() :]}"
    if key.startswith("head."):
        return "segmentation_head.0." + key.removeprefix("head.")
    return key


def _rename_legacy_unet_keys(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """load_state_dict pre-hook: rename a legacy U-Net's keys in place (its model files and
    checkpoints; parameters come in the same order, so optimizer states fit too)."""
    for key in list(state_dict):
        if key.startswith(prefix):
            new = prefix + _legacy_unet_key(key[len(prefix) :])
            if new != key:
                state_dict[new] = state_dict.pop(key)


def check_chip_size(model: nn.Module, name: str, chip_size: int) -> None:
    """Refuse training an smp model on chips whose side is not a multiple of its output
    stride (the model would pad every chip and learn from the padding)."""
    if not isinstance(model, SmpPadding):
        return
    multiple = int(model.size_multiple)
    if chip_size % multiple == 0:
        return
    lower, upper = chip_size // multiple * multiple, (chip_size // multiple + 1) * multiple
    sizes = f"{lower} or {upper}" if lower else str(upper)
    raise TrainingError(
        f"--model {name} needs chips whose side is a multiple of {multiple} px (its encoder's "
        f"output stride); the store's chips are {chip_size} px: re-tile with --chip-size {sizes}"
    )
