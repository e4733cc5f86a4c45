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

`pretrained=PATH` reads the encoder's weights from a file instead (`read_weights_file`: a state
dict saved with `torch.save` or as safetensors, or a landcover `model.pt`, whose `encoder.*`
tensors are taken). smp models (`landcover.models.smp_models`) adapt the stem the way smp does
and read `imagenet` from the Hugging Face cache only (`hf_cached_file`), never the network.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landcover.errors import TrainingError
from landcover.models.weightsource import IMAGENET, check_pretrained_value

logger = logging.getLogger(__name__)

__all__ = [
    "PRETRAINED_CHOICES",
    "check_pretrained",
    "download_weights",
    "encoder_tensors",
    "hf_cached_file",
    "load_encoder_state",
    "pretrained_state",
    "read_weights_file",
    "replace_conv_in_channels",
    "widen_stem_weight",
]

PRETRAINED_CHOICES = (IMAGENET,)


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
    check_pretrained_value(pretrained)
    if not supported:
        raise TrainingError(f"{name} has no pretrained weights; use pretrained=None")
    return True


def pretrained_state(
    pretrained: str, model_name: str, imagenet: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The weights `pretrained` names: `imagenet()` for "imagenet", else the file's."""
    return imagenet() if pretrained == IMAGENET else read_weights_file(pretrained, model_name)


def read_weights_file(path: str, model_name: str) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: safetensors by suffix, else `torch.load(weights_only=True)`
    of a state dict, or of a dict holding one under `state_dict` (a landcover `model.pt`)."""
    if not os.path.isfile(path):
        raise TrainingError(
            f"{model_name}: pretrained weights file {path} not found; give the path of an "
            "encoder state dict (.pth, .safetensors)"
        )
    try:
        if path.lower().endswith(".safetensors"):
            from safetensors.torch import load_file

            payload: Any = load_file(path, device="cpu")
        else:
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch/safetensors raise RuntimeError, UnpicklingError, EOFError…
        reason = (str(exc).strip().split(". ")[0] or type(exc).__name__).splitlines()[0]
        raise TrainingError(
            f"{model_name}: cannot read pretrained weights {path} ({reason}); give a state dict "
            "saved with torch.save or safetensors"
        ) from None
    if isinstance(payload, dict) and isinstance(payload.get("state_dict"), dict):
        payload = payload["state_dict"]
    if not isinstance(payload, dict) or not all(
        isinstance(v, torch.Tensor) for v in payload.values()
    ):
        raise TrainingError(
            f"{model_name}: pretrained weights {path} are not a state dict of tensors; give "
            "an encoder state dict (.pth, .safetensors)"
        )
    return dict(payload)


def encoder_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a state dict: those under `encoder.` (a whole segmentation
    model's) without that prefix, else all of them (an encoder's own)."""
    prefix = "encoder."
    if any(k.startswith(prefix) for k in state):
        return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
    return dict(state)


def hf_cached_file(repo_id: str, filename: str, revision: str, model_name: str) -> str:
    """The path of `filename` of a Hugging Face repo in the local cache, never downloaded;
    TrainingError naming where to place it when it is not there."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename, revision=revision)
    if isinstance(cached, str):
        return cached
    folder = "models--" + repo_id.replace("/", "--")
    expected = os.path.join(constants.HF_HUB_CACHE, folder, "snapshots", revision, filename)
    raise TrainingError(
        f"{model_name}: ImageNet weights are not in the Hugging Face cache and landcover never "
        f"downloads them; place {filename} of {repo_id} (revision {revision}) at {expected} "
        "(HF_HUB_CACHE sets the cache), or pass --pretrained PATH of an encoder state dict"
    )
