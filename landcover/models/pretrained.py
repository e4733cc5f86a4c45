"""4-band stems and pretrained encoder weights.

`pretrained="imagenet"` means ImageNet weights for the *encoder / backbone*, for every model
that has one: ResNet-18/34/50 for the U-Nets and for `deeplabv3_resnet50` / `fcn_resnet50`
(torchvision's ImageNet ResNet-50, the same backbone its COCO models start from; the COCO
heads predict 21 VOC classes, which would be thrown away anyway), and MobileNetV3-Large for
`lraspp_mobilenet_v3_large`. Decoders and heads start random. The first convolution is widened
to `in_channels`: the RGB filters are kept as they are and each extra band (NIR) gets the mean
of the RGB filters, so a pretrained network sees NIR as "another brightness" at the start.

Weights come from torchvision's URLs through the torch hub cache (`$TORCH_HOME/hub/checkpoints`).
Without network and without a seeded cache, building a pretrained model raises `TrainingError`;
it never falls back to a random init.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from typing import Any

import torch
from torch import nn

from landcover.errors import TrainingError

logger = logging.getLogger(__name__)

__all__ = [
    "PRETRAINED_CHOICES",
    "check_pretrained",
    "download_weights",
    "load_encoder_state",
    "replace_conv_in_channels",
    "widen_stem_weight",
]

PRETRAINED_CHOICES = ("imagenet",)


def widen_stem_weight(rgb_weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """Turn an RGB first-conv weight (O, 3, k, k) into (O, in_channels, k, k).

    The first three input channels keep the RGB filters; every extra band gets the mean of the
    RGB filters. With fewer than 3 bands every band gets that mean.
    """
    if rgb_weight.ndim != 4 or rgb_weight.shape[1] != 3:
        raise TrainingError(
            f"pretrained stem weight has shape {tuple(rgb_weight.shape)}, expected (out, 3, k, k)"
        )
    mean = rgb_weight.mean(dim=1, keepdim=True)
    if in_channels < 3:
        return mean.repeat(1, in_channels, 1, 1).clone()
    extra = mean.repeat(1, in_channels - 3, 1, 1)
    return torch.cat([rgb_weight, extra], dim=1).contiguous()


def replace_conv_in_channels(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """`conv` itself if it takes `in_channels` already, else a fresh conv like it that does."""
    if conv.in_channels == in_channels:
        return conv
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        kernel_size=conv.kernel_size,  # type: ignore[arg-type]
        stride=conv.stride,  # type: ignore[arg-type]
        padding=conv.padding,  # type: ignore[arg-type]
        dilation=conv.dilation,  # type: ignore[arg-type]
        groups=conv.groups,
        bias=conv.bias is not None,
    )


def download_weights(weights_name: str, model_name: str) -> dict[str, torch.Tensor]:
    """ImageNet weights (`weights_name` of torchvision.models, e.g. "ResNet18_Weights") from
    the torch hub cache, downloading them if needed."""
    import torchvision.models as tvm

    url = str(getattr(tvm, weights_name).IMAGENET1K_V1.url)
    file_name = os.path.basename(url)
    cache_dir = os.path.join(torch.hub.get_dir(), "checkpoints")
    cached = os.path.join(cache_dir, file_name)
    if os.path.exists(cached):
        # torch.hub loads a cached file without checking it: a copy cut short or overwritten
        # fails here, and would otherwise read as a download problem.
        return _load_cached_weights(cached, model_name)
    try:
        # torch.hub writes "Downloading ..." to stdout; library code never prints.
        with contextlib.redirect_stdout(io.StringIO()) as captured:
            state = torch.hub.load_state_dict_from_url(
                url, progress=False, map_location="cpu", weights_only=True
            )
        if captured.getvalue().strip():
            logger.info("%s", captured.getvalue().strip())
    except (OSError, RuntimeError, ValueError, EOFError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise TrainingError(
            f"{model_name}: could not download ImageNet weights {url} ({reason}); without "
            f"network, pre-seed the cache: copy {file_name} into {cache_dir} (set TORCH_HOME "
            "to choose the cache directory), or use pretrained=None"
        ) from None
    return _checked_state(state, cached, model_name)


def _load_cached_weights(path: str, model_name: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, KeyError…
        reason = (str(exc).strip().split(". ")[0] or type(exc).__name__).splitlines()[0]
        raise TrainingError(
            f"{model_name}: the cached ImageNet weights {path} are truncated or corrupt "
            f"({reason}); delete that file to download them again (or copy a good "
            f"{os.path.basename(path)} there)"
        ) from None
    return _checked_state(state, path, model_name)


def _checked_state(state: Any, path: str, model_name: str) -> dict[str, torch.Tensor]:
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TrainingError(
            f"{model_name}: the cached ImageNet weights {path} are not a state dict of "
            f"tensors; delete that file to download them again"
        )
    return dict(state)


def load_encoder_state(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    *,
    stem_key: str,
    in_channels: int,
    model_name: str,
) -> None:
    """Load `state` into `module` (strict except for keys the module does not have)."""
    state = dict(state)
    if stem_key not in state:
        raise TrainingError(
            f"{model_name}: pretrained weights have no {stem_key}; the cached weight file is "
            "not the expected one"
        )
    state[stem_key] = widen_stem_weight(state[stem_key], in_channels)
    own = module.state_dict()
    unused = sorted(k for k in state if k not in own)
    state = {k: v for k, v in state.items() if k in own}
    missing = sorted(k for k in own if k not in state)
    if missing:
        raise TrainingError(
            f"{model_name}: pretrained weights miss {len(missing)} encoder tensors "
            f"(first: {missing[0]}); the cached weight file is not the expected one"
        )
    module.load_state_dict(state, strict=True)
    logger.debug("%s: loaded %d pretrained tensors, ignored %s", model_name, len(state), unused)


def check_pretrained(name: str, pretrained: str | None, *, supported: bool) -> bool:
    """Whether model `name` loads pretrained weights; an unknown or unsupported value fails."""
    if pretrained is None:
        return False
    if pretrained not in PRETRAINED_CHOICES:
        raise TrainingError(
            f"pretrained={pretrained!r} is not known; use one of {list(PRETRAINED_CHOICES)} or None"
        )
    if not supported:
        raise TrainingError(f"{name} has no pretrained weights; use pretrained=None")
    return True
