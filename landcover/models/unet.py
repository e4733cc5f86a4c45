"""U-Nets: `SmallUNet` (for CPU training and tests) and `ResNetUNet`, a U-Net decoder on a
torchvision ResNet encoder with a 4-band stem, and their builders.

Both pad the input up to a multiple of their total stride and crop the logits back, so they
take any H, W. torchvision is imported by the ResNet builder, not with this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from landcover.models.pretrained import (
    check_pretrained,
    download_weights,
    load_encoder_state,
    replace_conv_in_channels,
)

if TYPE_CHECKING:
    import torchvision.models as tvm

__all__ = ["ResNetEncoder", "ResNetUNet", "SmallUNet", "build_small_unet", "build_unet_resnet"]


def _conv_bn_relu(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(inplace=True),
    )


def _double_conv(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn_relu(in_ch, out_ch), _conv_bn_relu(out_ch, out_ch))


def pad_to_multiple(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
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
        x, height, width = pad_to_multiple(x, self.size_multiple)
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
        x, height, width = pad_to_multiple(x, self.size_multiple)
        features = self.encoder(x)
        y = features[-1]
        skips: list[torch.Tensor | None] = [*reversed(features[:-1]), None]
        for block, skip in zip(self.decoder, skips, strict=True):
            y = block(y, skip)
        logits: torch.Tensor = self.head(y)
        return logits[..., :height, :width]


def build_small_unet(in_channels: int, num_classes: int, pretrained: str | None) -> nn.Module:
    """`small_unet`: a `SmallUNet`, never pretrained."""
    check_pretrained("small_unet", pretrained, supported=False)
    return SmallUNet(in_channels, num_classes)


def build_unet_resnet(
    name: str, depth: int, in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    """`unet_resnet<depth>`: a `ResNetUNet` on torchvision's ResNet-<depth>, its encoder
    ImageNet-pretrained when `pretrained="imagenet"`."""
    import torchvision.models as tvm

    use_weights = check_pretrained(name, pretrained, supported=True)
    resnet = getattr(tvm, f"resnet{depth}")(weights=None)
    resnet.conv1 = replace_conv_in_channels(resnet.conv1, in_channels)
    encoder = ResNetEncoder(resnet)
    if use_weights:
        state = download_weights(f"ResNet{depth}_Weights", name)
        load_encoder_state(
            encoder, state, stem_key="conv1.weight", in_channels=in_channels, model_name=name
        )
    return ResNetUNet(encoder, num_classes)
