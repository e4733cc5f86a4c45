"""4-band stems and pretrained encoder weights.

`pretrained="imagenet"` means ImageNet weights for the *encoder / backbone*, for every model
that has one: ResNet-18/34/50 for the U-Nets and for `deeplabv3_resnet50` / `fcn_resnet50`
(torchvision's ImageNet ResNet-50, the same backbone its COCO models start from; the COCO
heads predict 21 VOC classes, which would be thrown away anyway), and MobileNetV3-Large for
`lraspp_mobilenet_v3_large`. Decoders and heads start random. The first convolution is widened
to `in_channels`: the RGB filters are kept as they are and each extra band (NIR) gets the mean
of the RGB filters, so a pretrained network sees NIR as "another brightness" at the start.

Weights are torchvision's ImageNet files, read from the torch hub cache
(`$TORCH_HOME/hub/checkpoints`) only: nothing here downloads (torch.hub's downloader is never
called). Without the file in the cache, building a pretrained model raises `TrainingError`
naming the file and where to place it; it never falls back to a random init.

`pretrained=PATH` reads the encoder's weights from a file instead (`read_weights_file`: a state
dict saved with `torch.save` or as safetensors, or a landcover `model.pt`, whose encoder's
tensors are taken). smp models (`landcover.models.smp_models`) adapt the stem the way smp does
and read `imagenet` from the Hugging Face cache only (`hf_cached_file`), never the network.
Weights of another encoder are refused (`check_encoder_fit`: a tensor the encoder lacks, one it
has that they miss, one of another shape), never loaded in part.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from landcover.errors import TrainingError
from landcover.models.weightsource import IMAGENET, WEIGHT_FILE_SUFFIXES, check_pretrained_value

logger = logging.getLogger(__name__)

__all__ = [
    "ENCODER_FIX",
    "PRETRAINED_CHOICES",
    "EncoderWeights",
    "check_encoder_fit",
    "check_pretrained",
    "encoder_tensors",
    "hf_cached_file",
    "imagenet_weights",
    "load_encoder_state",
    "pretrained_state",
    "read_weights_file",
    "replace_conv_in_channels",
    "widen_stem_weight",
]

PRETRAINED_CHOICES = (IMAGENET,)
# What to do about weights that are not the encoder's: every such refusal ends with it.
ENCODER_FIX = "give the weights of this encoder (--pretrained PATH), or leave out --pretrained"
# First key parts of ImageNet classification heads: torchvision/timm `fc`, `head`,
# `classifier`, EfficientNet's `_fc`, pretrainedmodels' `last_linear`.
_CLASSIFIER_HEADS = frozenset({"fc", "_fc", "classifier", "head", "last_linear"})
_BATCHES_TRACKED = "num_batches_tracked"


@dataclass(frozen=True, slots=True)
class EncoderWeights:
    """Pretrained tensors and the file they came from (named by every refusal)."""

    tensors: dict[str, torch.Tensor]
    source: str


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


def imagenet_weights(weights_name: str, model_name: str) -> EncoderWeights:
    """torchvision's ImageNet weights (`weights_name` of torchvision.models, e.g.
    "ResNet18_Weights") from the torch hub cache, `$TORCH_HOME/hub/checkpoints`. Never
    downloaded: the file is looked up in the cache and nothing of torch.hub's downloader runs;
    TrainingError naming the file, its URL and where to place it when it is not there."""
    import torchvision.models as tvm

    url = str(getattr(tvm, weights_name).IMAGENET1K_V1.url)
    file_name = os.path.basename(url)
    cache_dir = os.path.join(torch.hub.get_dir(), "checkpoints")
    cached = os.path.join(cache_dir, file_name)
    if os.path.isfile(cached):
        # torch.hub loads a cached file without checking it: a copy cut short or overwritten
        # fails here, in one line naming the file.
        return EncoderWeights(_load_cached_weights(cached, model_name), cached)
    found = " (a directory is there)" if os.path.isdir(cached) else ""
    raise TrainingError(
        f"{model_name}: ImageNet weights are not in the torch hub cache{found} and landcover "
        f"never downloads them; place {file_name} (from {url}) at {cached} (TORCH_HOME sets "
        "the cache), or pass --pretrained PATH of an encoder state dict"
    )


def _load_cached_weights(path: str, model_name: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, KeyError…
        raise TrainingError(
            f"{model_name}: the cached ImageNet weights {path} are truncated or corrupt "
            f"({_first_reason(exc)}); replace that file by a good copy of "
            f"{os.path.basename(path)}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TrainingError(
            f"{model_name}: the cached ImageNet weights {path} are not a state dict of "
            f"tensors; replace that file by a good copy of {os.path.basename(path)}"
        )
    return dict(state)


# How a file that torch.save wrote begins: a zip archive (the format since torch 1.6), or a
# pickle (protocol 2 and above start with the PROTO opcode).
_TORCH_SAVE_STARTS = (b"PK\x03\x04", b"\x80")


def unreadable_reason(path: str, exc: Exception) -> str:
    """Why the weights file at `path` could not be read, in a user's terms: not a file of
    torch.save at all (a text, an image, random bytes), one that holds objects other than
    tensors (which only running its code would rebuild, refused), or one cut short or damaged;
    torch's own first sentence (such as 'list index out of range') only with the last."""
    if path.lower().endswith(".safetensors"):
        return f"not a readable safetensors file: {_first_reason(exc)}"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as error:
        return error.strerror or type(error).__name__
    if not head.startswith(_TORCH_SAVE_STARTS):
        return "not a file written by torch.save, nor safetensors"
    if "weights only load failed" in str(exc).lower():
        return "it holds objects other than tensors, which would need running its code"
    return f"the file is truncated or corrupt: {_first_reason(exc)}"


def _first_reason(exc: Exception) -> str:
    """The first sentence of an exception's message, on one line."""
    return (str(exc).strip().split(". ")[0] or type(exc).__name__).splitlines()[0]


def load_encoder_state(
    module: nn.Module,
    weights: EncoderWeights,
    *,
    stem_key: str,
    in_channels: int,
    model_name: str,
) -> None:
    """Load `weights` into the encoder `module`: every tensor it has, of its shapes, and none
    it lacks (an ImageNet classifier head aside, `check_encoder_fit`); a 3-band stem is widened
    to `in_channels` (`widen_stem_weight`), a stem of `in_channels` bands loads as it is."""
    state = dict(weights.tensors)
    if stem_key not in state:
        raise TrainingError(
            f"{model_name}: the pretrained weights {weights.source} have no {stem_key}: they "
            f"are not this encoder's; {ENCODER_FIX}"
        )
    stem = state[stem_key]
    if stem.ndim == 4 and stem.shape[1] == 3:
        state[stem_key] = widen_stem_weight(stem, in_channels)
    elif stem.ndim != 4 or stem.shape[1] != in_channels:
        raise TrainingError(
            f"{model_name}: the pretrained stem {stem_key} of {weights.source} has shape "
            f"{tuple(stem.shape)}; expected 3 or {in_channels} input bands; {ENCODER_FIX}"
        )
    own = module.state_dict()
    loaded = check_encoder_fit(own, state, model_name=model_name, source=weights.source)
    module.load_state_dict(loaded, strict=False)  # missing: only BatchNorm's step counts
    logger.debug("%s: loaded %d pretrained tensors", model_name, len(loaded))


def check_encoder_fit(
    own: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    *,
    model_name: str,
    source: str,
    skip_shapes: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """The tensors of `state` that the encoder whose state dict is `own` loads; TrainingError
    (one line naming the file, the first odd tensor and the fix) when `state` holds a tensor
    the encoder lacks (another encoder's: resnet34 weights hold layer1.2, which resnet18
    lacks), lacks one it has, or holds one of another shape. An ImageNet classifier head
    (`fc`, `classifier`, `head`, ...) is no encoder tensor and is left out, and BatchNorm's
    step counts (`num_batches_tracked`, absent from older files) may be missing. The shapes
    of `skip_shapes` (a stem widened by the caller's rule) are not compared."""
    extra = sorted(k for k in state if k not in own and not _is_classifier_head(k))
    if extra:
        raise TrainingError(
            f"{model_name}: the pretrained weights {source} hold {len(extra)} tensors that the "
            f"encoder does not have (first: {extra[0]}): they are another encoder's; "
            f"{ENCODER_FIX}"
        )
    missing = sorted(k for k in own if k not in state and not k.endswith(_BATCHES_TRACKED))
    if missing:
        raise TrainingError(
            f"{model_name}: the pretrained weights {source} miss {len(missing)} of the "
            f"encoder's {len(own)} tensors (first: {missing[0]}); {ENCODER_FIX}"
        )
    for key, tensor in state.items():
        if key in own and key not in skip_shapes and tensor.shape != own[key].shape:
            raise TrainingError(
                f"{model_name}: the pretrained tensor {key} of {source} has shape "
                f"{tuple(tensor.shape)}, the encoder's has {tuple(own[key].shape)}: they are "
                f"another encoder's weights; {ENCODER_FIX}"
            )
    return {k: v for k, v in state.items() if k in own}


def _is_classifier_head(key: str) -> bool:
    """Whether `key` is a tensor of an ImageNet classification head (of a torchvision, smp
    or timm network: `fc.weight`, `_fc.bias`, `classifier.1.weight`, `model.head.weight`)."""
    return key.removeprefix("model.").split(".")[0] in _CLASSIFIER_HEADS


def check_pretrained(name: str, pretrained: str | None, *, supported: bool) -> bool:
    """Whether model `name` loads pretrained weights; an unknown or unsupported value fails."""
    if pretrained is None:
        return False
    check_pretrained_value(pretrained)
    if not supported:
        raise TrainingError(f"{name} has no pretrained weights; leave out --pretrained")
    return True


def pretrained_state(
    pretrained: str, model_name: str, imagenet: Callable[[], EncoderWeights]
) -> EncoderWeights:
    """The weights `pretrained` names: `imagenet()` for "imagenet", else the file's."""
    if pretrained == IMAGENET:
        return imagenet()
    return EncoderWeights(read_weights_file(pretrained, model_name), pretrained)


def read_weights_file(path: str, model_name: str) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: safetensors by suffix, else `torch.load(weights_only=True)`
    of a state dict, or of a dict holding one under `state_dict` (a landcover `model.pt`)."""
    if os.path.isdir(path):
        raise TrainingError(
            f"{model_name}: --pretrained {path} is a directory; give the weights file in it "
            f"(an encoder state dict: {', '.join(WEIGHT_FILE_SUFFIXES)})"
        )
    if not os.path.isfile(path):
        raise TrainingError(
            f"{model_name}: pretrained weights file {path} not found; give the path of an "
            f"encoder state dict ({', '.join(WEIGHT_FILE_SUFFIXES)})"
        )
    try:
        if path.lower().endswith(".safetensors"):
            from safetensors.torch import load_file

            payload: Any = load_file(path, device="cpu")
        else:
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch/safetensors raise RuntimeError, UnpicklingError, EOFError…
        why = unreadable_reason(path, exc)
        raise TrainingError(
            f"{model_name}: cannot read pretrained weights {path} ({why}); give "
            "a state dict saved with torch.save or safetensors"
        ) from None
    if isinstance(payload, dict) and isinstance(payload.get("state_dict"), dict):
        payload = payload["state_dict"]
    if not isinstance(payload, dict) or not all(
        isinstance(v, torch.Tensor) for v in payload.values()
    ):
        raise TrainingError(
            f"{model_name}: pretrained weights {path} are not a state dict of tensors; give "
            f"an encoder state dict ({', '.join(WEIGHT_FILE_SUFFIXES)})"
        )
    return dict(payload)


def encoder_tensors(weights: EncoderWeights, *prefixes: str) -> EncoderWeights:
    """The encoder's tensors of `weights`: those under the first of `prefixes` (default
    `encoder.`) that any key has (a whole segmentation model's state dict, as in a landcover
    model.pt), without that prefix; else all of them (an encoder's own)."""
    for prefix in prefixes or ("encoder.",):
        if any(k.startswith(prefix) for k in weights.tensors):
            tensors = {
                k.removeprefix(prefix): v
                for k, v in weights.tensors.items()
                if k.startswith(prefix)
            }
            return EncoderWeights(tensors, weights.source)
    return weights


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
