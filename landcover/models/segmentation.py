"""torchvision's segmentation models (`deeplabv3_resnet50`, `fcn_resnet50`,
`lraspp_mobilenet_v3_large`) with 4-band stems, wrapped to return a logits Tensor.

They interpolate their output to the input size themselves; `TorchvisionSegmentation` unwraps
their `{"out": ...}` dict. torchvision is imported by the builders, not with this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from landcover.models.pretrained import (
    EncoderWeights,
    check_pretrained,
    encoder_tensors,
    imagenet_weights,
    load_encoder_state,
    pretrained_state,
    replace_conv_in_channels,
)

__all__ = [
    "TorchvisionSegmentation",
    "build_lraspp_mobilenet_v3_large",
    "build_resnet50_segmentation",
]

# Where a landcover model.pt of these models holds the backbone's tensors.
_BACKBONE_PREFIX = "net.backbone."


class TorchvisionSegmentation(nn.Module):
    """Wraps a torchvision segmentation model so forward returns the `out` logits Tensor."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)["out"]
        return out


def build_resnet50_segmentation(
    name: str, in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    """`deeplabv3_resnet50` or `fcn_resnet50` (torchvision's builder `name`), its ResNet-50
    backbone ImageNet-pretrained when `pretrained="imagenet"`, or from a weights file."""
    import torchvision.models.segmentation as tvseg

    use_weights = check_pretrained(name, pretrained, supported=True)
    factory = getattr(tvseg, name)
    # weights_backbone defaults to ImageNet in torchvision: pass None so nothing downloads.
    net = factory(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False)
    backbone: Any = net.backbone
    backbone.conv1 = replace_conv_in_channels(backbone.conv1, in_channels)
    if use_weights:
        assert pretrained is not None
        state = pretrained_state(
            pretrained, name, lambda: imagenet_weights("ResNet50_Weights", name)
        )
        load_encoder_state(
            backbone,
            encoder_tensors(state, _BACKBONE_PREFIX),  # a landcover model.pt of this model
            stem_key="conv1.weight",
            in_channels=in_channels,
            model_name=name,
        )
    return TorchvisionSegmentation(net)


def build_lraspp_mobilenet_v3_large(
    in_channels: int, num_classes: int, pretrained: str | None
) -> nn.Module:
    """`lraspp_mobilenet_v3_large`, its MobileNetV3 backbone ImageNet-pretrained when
    `pretrained="imagenet"`, or from a weights file."""
    import torchvision.models.segmentation as tvseg

    name = "lraspp_mobilenet_v3_large"
    use_weights = check_pretrained(name, pretrained, supported=True)
    net = tvseg.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=num_classes
    )
    stem: Any = net.backbone["0"]
    stem[0] = replace_conv_in_channels(stem[0], in_channels)
    if use_weights:
        assert pretrained is not None
        state = pretrained_state(
            pretrained, name, lambda: imagenet_weights("MobileNet_V3_Large_Weights", name)
        )
        # The backbone is mobilenet.features (ImageNet: drop the "features." prefix and the
        # classifier), or a landcover model.pt's backbone.
        features: EncoderWeights = encoder_tensors(state, _BACKBONE_PREFIX, "features.")
        load_encoder_state(
            net.backbone, features, stem_key="0.0.weight", in_channels=in_channels, model_name=name
        )
    return TorchvisionSegmentation(net)
