"""Fixtures of the model tests: one torch thread, and a torch hub cache seeded with fake
ImageNet files (random weights under torchvision's file names), so that no test downloads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    # These inputs are tiny: one thread is as fast, and it stays fast when other processes
    # load the 2 cores (2 OpenMP threads on a busy machine ran 20x slower, measured).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def seeded_torch_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TORCH_HOME whose hub cache holds fake ImageNet files (random weights, real names)."""
    import torchvision.models as tvm

    home = tmp_path_factory.mktemp("torch_home")
    checkpoints = home / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    factories = {
        tvm.ResNet18_Weights.IMAGENET1K_V1: tvm.resnet18,
        tvm.ResNet34_Weights.IMAGENET1K_V1: tvm.resnet34,
        tvm.ResNet50_Weights.IMAGENET1K_V1: tvm.resnet50,
        tvm.MobileNet_V3_Large_Weights.IMAGENET1K_V1: tvm.mobilenet_v3_large,
    }
    torch.manual_seed(123)
    for weights, factory in factories.items():
        state = factory(weights=None).state_dict()
        torch.save(state, checkpoints / os.path.basename(weights.url))
    return home
