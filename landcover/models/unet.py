"""`SmallUNet` (for CPU training and tests), its builder, and `pad_to_multiple`.

It pads the input up to a multiple of its total stride and crops the logits back, so it takes
any H, W. The ResNet U-Nets (`unet_resnet*`) are smp's Unet: `landcover.models.smp_models`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landcover.models.pretrained import check_pretrained

__all__ = ["SmallUNet", "build_small_unet", "pad_to_multiple"]


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


def build_small_unet(in_channels: int, num_classes: int, pretrained: str | None) -> nn.Module:
    """`small_unet`: a `SmallUNet`, never pretrained."""
    check_pretrained("small_unet", pretrained, supported=False)
    return SmallUNet(in_channels, num_classes)
