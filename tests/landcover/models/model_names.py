"""What the model tests share besides fixtures: the registered names, which torchvision ImageNet
file each pretrained model reads, and how to find a model's stem."""

from __future__ import annotations

import torchvision.models as tvm
from torch import nn

ALL_MODELS = [
    "deeplabv3_resnet50",
    "fcn_resnet50",
    "lraspp_mobilenet_v3_large",
    "small_unet",
    "unet_resnet18",
    "unet_resnet34",
    "unet_resnet50",
]
PRETRAINED_MODELS = [name for name in ALL_MODELS if name != "small_unet"]
# Which torchvision ImageNet file each pretrained model reads.
WEIGHTS_OF: dict[str, tvm.WeightsEnum] = {
    "unet_resnet18": tvm.ResNet18_Weights.IMAGENET1K_V1,
    "unet_resnet34": tvm.ResNet34_Weights.IMAGENET1K_V1,
    "unet_resnet50": tvm.ResNet50_Weights.IMAGENET1K_V1,
    "deeplabv3_resnet50": tvm.ResNet50_Weights.IMAGENET1K_V1,
    "fcn_resnet50": tvm.ResNet50_Weights.IMAGENET1K_V1,
    "lraspp_mobilenet_v3_large": tvm.MobileNet_V3_Large_Weights.IMAGENET1K_V1,
}


def stem_conv(model: nn.Module, in_channels: int) -> nn.Conv2d:
    """The first convolution that reads the input bands."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == in_channels:
            return module
    raise LookupError(f"no conv with {in_channels} input channels")
