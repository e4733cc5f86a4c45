"""Model registry: a plain dict of name → builder, and one factory.

Every model takes `in_channels` bands (R, G, B, NIR by default) and returns logits
(B, num_classes, H, W) as a Tensor for any H, W: the U-Nets pad the input up to a multiple of
their total stride and crop the logits back; the torchvision segmentation models interpolate
their output to the input size themselves (we unwrap their `{"out": ...}` dict).

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

torchvision is imported by the builders that need it, not with this module: importing
`torchvision.models` takes seconds, paid by every DDP worker, and `small_unet` (and
`available()`) need none of it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from landcover.errors import TrainingError, UnknownModelError

if TYPE_CHECKING:
    import torchvision.models as tvm

logger = logging.getLogger(__name__)

PRETRAINED_CHOICES = ("imagenet",)

ModelBuilder = Callable[[int, int, str | None], nn.Module]


# -- building blocks ----------------------------------------------------------------------------


def _conv_bn_relu(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    )


def _double_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn_relu(in_ch, out_ch), _conv_bn_relu(out_ch, out_ch))


def _pad_to_multiple(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    """Pad H, W at the bottom/right up to a multiple; returns the padded tensor and old H, W."""
    height, width = x.shape[-2:]
    pad_h = (-height) % multiple
    pad_w = (-width) % multiple
    if pad_h or pad_w:
        # Reflection keeps image statistics at the edge; it needs pad < size, else replicate.
        mode = "reflect" if pad_h < height and pad_w < width else "replicate"
        x = F.pad(x, (0, pad_w, 0, pad_h), mode=mode)
    return x, height, width


class SmallUNet(nn.Module):
    """A 4-level U-Net (widths 16-32-64-128, ~0.47 M parameters) for CPU training and tests."""

    size_multiple = 8  # three 2x poolings

    def __init__(self, in_channels: int, num_classes: int, base_width: int = 16) -> None:
        super().__init__()
        widths = [base_width * 2**i for i in range(4)]
        self.enc = nn.ModuleList()
        previous = in_channels
        for width in widths:
            self.enc.append(_double_conv(previous, width))
            previous = width
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for width in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(previous, width, kernel_size=2, stride=2))
            self.dec.append(_double_conv(2 * width, width))
            previous = width
        self.head = nn.Conv2d(previous, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, height, width = _pad_to_multiple(x, self.size_multiple)
        skips: list[torch.Tensor] = []
        for i, block in enumerate(self.enc):
            if i:
                x = F.max_pool2d(x, 2)
            x = block(x)
            skips.append(x)
        skips.pop()  # the bottleneck output is x itself
        for up, dec in zip(self.up, self.dec, strict=True):
            x = up(x)
            x = dec(torch.cat([x, skips.pop()], dim=1))
        logits: torch.Tensor = self.head(x)
        return logits[..., :height, :width]


class ResNetEncoder(nn.Module):
    """A torchvision ResNet without avgpool/fc; state-dict keys match the ResNet's own."""

    def __init__(self, resnet: tvm.ResNet) -> None:
        super().__init__()
        self.conv1 = resnet.conv1
        self.bn1 = resnet.bn1
        self.relu = resnet.relu
        self.maxpool = resnet.maxpool
        self.layer1 = resnet.layer1
        self.layer2 = resnet.layer2
        self.layer3 = resnet.layer3
        self.layer4 = resnet.layer4
        expansion = int(resnet.layer1[0].expansion)  # 1 for BasicBlock, 4 for Bottleneck
        self.channels = [self.conv1.out_channels, *(w * expansion for w in (64, 128, 256, 512))]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Features at strides 2, 4, 8, 16, 32."""
        s2 = self.relu(self.bn1(self.conv1(x)))
        s4 = self.layer1(self.maxpool(s2))
        s8 = self.layer2(s4)
        s16 = self.layer3(s8)
        s32 = self.layer4(s16)
        return [s2, s4, s8, s16, s32]


class _DecoderBlock(nn.Module):
    def __init__(self, in_ch: int, skip_ch: int, out_ch: int) -> None:
        super().__init__()
        self.block = _double_conv(in_ch + skip_ch, out_ch)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
        out: torch.Tensor = self.block(x)
        return out


class ResNetUNet(nn.Module):
    """U-Net decoder on a ResNet encoder: skips at strides 16, 8, 4, 2, then up to stride 1."""

    size_multiple = 32
    decoder_channels = (256, 128, 64, 32, 16)

    def __init__(self, encoder: ResNetEncoder, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        skip_channels = [*reversed(encoder.channels[:-1]), 0]
        in_ch = encoder.channels[-1]
        blocks = []
        for skip_ch, out_ch in zip(skip_channels, self.decoder_channels, strict=True):
            blocks.append(_DecoderBlock(in_ch, skip_ch, out_ch))
            in_ch = out_ch
        self.decoder = nn.ModuleList(blocks)
        self.head = nn.Conv2d(in_ch, num_classes, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, height, width = _pad_to_multiple(x, self.size_multiple)
        features = self.encoder(x)
        y = features[-1]
        skips: list[torch.Tensor | None] = [*reversed(features[:-1]), None]
        for block, skip in zip(self.decoder, skips, strict=True):
            y = block(y, skip)
        logits: torch.Tensor = self.head(y)
        return logits[..., :height, :width]


class TorchvisionSegmentation(nn.Module):
    """Wraps a torchvision segmentation model so forward returns the `out` logits Tensor."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)["out"]
        return out


# -- stems and pretrained weights ---------------------------------------------------------------


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


def _replace_conv_in_channels(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
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


def _download_weights(weights_name: str, model_name: str) -> dict[str, torch.Tensor]:
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


def _load_encoder_state(
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


def _check_pretrained(name: str, pretrained: str | None, *, supported: bool) -> bool:
    if pretrained is None:
        return False
    if pretrained not in PRETRAINED_CHOICES:
        raise TrainingError(
            f"pretrained={pretrained!r} is not known; use one of {list(PRETRAINED_CHOICES)} or None"
        )
    if not supported:
        raise TrainingError(f"{name} has no pretrained weights; use pretrained=None")
    return True


# -- builders -----------------------------------------------------------------------------------


def _small_unet(in_channels: int, num_classes: int, pretrained: str | None) -> nn.Module:
    _check_pretrained("small_unet", pretrained, supported=False)
    return SmallUNet(in_channels, num_classes)


def _unet_resnet(name: str, depth: int) -> ModelBuilder:
    def build(in_channels: int, num_classes: int, pretrained: str | None) -> nn.Module:
        import torchvision.models as tvm

        use_weights = _check_pretrained(name, pretrained, supported=True)
        resnet = getattr(tvm, f"resnet{depth}")(weights=None)
        resnet.conv1 = _replace_conv_in_channels(resnet.conv1, in_channels)
        encoder = ResNetEncoder(resnet)
        if use_weights:
            state = _download_weights(f"ResNet{depth}_Weights", name)
            _load_encoder_state(
                encoder, state, stem_key="conv1.weight", in_channels=in_channels, model_name=name
            )
        return ResNetUNet(encoder, num_classes)

    return build


def _resnet50_segmentation(name: str) -> ModelBuilder:
    def build(in_channels: int, num_classes: int, pretrained: str | None) -> nn.Module:
        import torchvision.models.segmentation as tvseg

        use_weights = _check_pretrained(name, pretrained, supported=True)
        factory = getattr(tvseg, name)
        # weights_backbone defaults to ImageNet in torchvision: pass None so nothing downloads.
        net = factory(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False)
        backbone: Any = net.backbone
        backbone.conv1 = _replace_conv_in_channels(backbone.conv1, in_channels)
        if use_weights:
            state = _download_weights("ResNet50_Weights", name)
            _load_encoder_state(
                backbone, state, stem_key="conv1.weight", in_channels=in_channels, model_name=name
            )
        return TorchvisionSegmentation(net)

    return build


def _lraspp_mobilenet_v3_large(
    in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    import torchvision.models.segmentation as tvseg

    name = "lraspp_mobilenet_v3_large"
    use_weights = _check_pretrained(name, pretrained, supported=True)
    net = tvseg.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=num_classes
    )
    stem: Any = net.backbone["0"]
    stem[0] = _replace_conv_in_channels(stem[0], in_channels)
    if use_weights:
        state = _download_weights("MobileNet_V3_Large_Weights", name)
        # The backbone is mobilenet.features: drop the "features." prefix and the classifier.
        features = {
            k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")
        }
        _load_encoder_state(
            net.backbone, features, stem_key="0.0.weight", in_channels=in_channels, model_name=name
        )
    return TorchvisionSegmentation(net)


_REGISTRY: dict[str, ModelBuilder] = {
    "small_unet": _small_unet,
    "unet_resnet18": _unet_resnet("unet_resnet18", 18),
    "unet_resnet34": _unet_resnet("unet_resnet34", 34),
    "unet_resnet50": _unet_resnet("unet_resnet50", 50),
    "deeplabv3_resnet50": _resnet50_segmentation("deeplabv3_resnet50"),
    "fcn_resnet50": _resnet50_segmentation("fcn_resnet50"),
    "lraspp_mobilenet_v3_large": _lraspp_mobilenet_v3_large,
}

DEFAULT_MODEL = "small_unet"


def available() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_REGISTRY)


def build_model(
    name: str, *, in_channels: int = 4, num_classes: int, pretrained: str | None = None
) -> nn.Module:
    """Build a registered model; forward maps (B, in_channels, H, W) to (B, num_classes, H, W)."""
    builder = _REGISTRY.get(name)
    if builder is None:
        raise UnknownModelError(f"unknown model {name!r}; choose one of: {', '.join(available())}")
    if in_channels < 1:
        raise TrainingError(f"in_channels={in_channels}: a model needs at least one input band")
    if num_classes < 1:
        raise TrainingError(f"num_classes={num_classes}: a model needs at least one class")
    return builder(in_channels, num_classes, pretrained)
