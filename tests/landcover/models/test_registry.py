"""The model registry: one shared test class run against every registered architecture."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision.models as tvm
from click.testing import CliRunner
from torch import nn

from landcover import cli
from landcover.errors import TrainingError, UnknownModelError
from landcover.models.pretrained import widen_stem_weight
from landcover.models.registry import available, build_model

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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    # These inputs are tiny: one thread is as fast, and it stays fast when other processes
    # load the 2 cores (2 OpenMP threads on a busy machine ran 20x slower, measured).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stem_conv(model: nn.Module, in_channels: int) -> nn.Conv2d:
    """The first convolution that reads the input bands."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.in_channels == in_channels:
            return module
    raise LookupError(f"no conv with {in_channels} input channels")


def test_available_lists_every_model() -> None:
    assert available() == ALL_MODELS


def test_small_unet_needs_no_torchvision_import() -> None:
    # Importing torchvision.models costs every DDP worker seconds; small_unet needs none of it.
    code = (
        "import sys; from landcover.models.registry import available, build_model; available(); "
        "build_model('small_unet', num_classes=5); print('torchvision' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("name", ALL_MODELS)
class TestEveryModel:
    def test_forward_backward_reaches_stem(self, name: str) -> None:
        torch.manual_seed(0)
        model = build_model(name, in_channels=4, num_classes=5).train()
        x = torch.randn(2, 4, 64, 64)
        logits = model(x)
        assert isinstance(logits, torch.Tensor)
        assert logits.shape == (2, 5, 64, 64)
        target = torch.randint(0, 5, (2, 64, 64))
        nn.functional.cross_entropy(logits, target).backward()  # type: ignore[no-untyped-call]
        grad = stem_conv(model, 4).weight.grad
        assert grad is not None
        assert torch.isfinite(grad).all()
        assert grad.abs().sum() > 0

    def test_num_classes_and_in_channels_respected(self, name: str) -> None:
        model = build_model(name, in_channels=5, num_classes=3).eval()
        with torch.no_grad():
            logits = model(torch.randn(1, 5, 64, 64))
        assert logits.shape == (1, 3, 64, 64)
        assert stem_conv(model, 5).in_channels == 5

    def test_odd_input_size_gives_logits_of_that_size(self, name: str) -> None:
        model = build_model(name, num_classes=4).eval()
        with torch.no_grad():
            logits = model(torch.randn(1, 4, 70, 90))
        assert logits.shape == (1, 4, 70, 90)
        assert torch.isfinite(logits).all()

    def test_state_dict_round_trip_rebuilds_same_function(self, name: str) -> None:
        torch.manual_seed(1)
        first = build_model(name, num_classes=3).eval()
        torch.manual_seed(2)
        second = build_model(name, num_classes=3).eval()
        second.load_state_dict(first.state_dict(), strict=True)
        x = torch.randn(1, 4, 64, 64)
        with torch.no_grad():
            torch.testing.assert_close(first(x), second(x))


def test_small_unet_is_small_and_crops_exactly() -> None:
    model = build_model("small_unet", num_classes=5)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    model.eval()
    # Padding must not leak into the kept region's shape, and tiny inputs (pad > size) work.
    with torch.no_grad():
        assert model(torch.randn(1, 4, 3, 5)).shape == (1, 5, 3, 5)
        assert model(torch.randn(1, 4, 33, 17)).shape == (1, 5, 33, 17)


def test_small_unet_learns_a_toy_segmentation() -> None:
    # Class = whether NIR exceeds red (an NDVI-like rule) plus a spatial smoothing; a
    # working U-Net gets this nearly right in a few dozen CPU steps.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, 32, 32, generator=g)
    x = nn.functional.avg_pool2d(x, 5, stride=1, padding=2)
    y = (x[:, 3] > x[:, 0]).long() + (x[:, 1] > 0.2).long()
    torch.manual_seed(0)
    model = build_model("small_unet", num_classes=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


def test_unknown_model_lists_available() -> None:
    with pytest.raises(UnknownModelError) as info:
        build_model("unet_resnet101", num_classes=5)
    message = str(info.value)
    assert message.startswith("unknown model 'unet_resnet101'; choose one of: ")
    assert all(name in message for name in ALL_MODELS)
    assert isinstance(info.value, KeyError)


def test_bad_pretrained_values_are_rejected() -> None:
    with pytest.raises(TrainingError, match=r"pretrained='coco' is not known; use one of"):
        build_model("unet_resnet18", num_classes=5, pretrained="coco")
    with pytest.raises(TrainingError, match="small_unet has no pretrained weights"):
        build_model("small_unet", num_classes=5, pretrained="imagenet")
    with pytest.raises(TrainingError, match="num_classes=0"):
        build_model("small_unet", num_classes=0)


def test_widen_stem_keeps_rgb_and_gives_extra_bands_the_rgb_mean() -> None:
    rgb = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    widened = widen_stem_weight(rgb, 5)
    assert widened.shape == (2, 5, 2, 2)
    torch.testing.assert_close(widened[:, :3], rgb)
    mean = rgb.mean(dim=1)
    torch.testing.assert_close(widened[:, 3], mean)
    torch.testing.assert_close(widened[:, 4], mean)
    torch.testing.assert_close(widen_stem_weight(rgb, 3), rgb)
    torch.testing.assert_close(widen_stem_weight(rgb, 1)[:, 0], mean)
    with pytest.raises(TrainingError, match=r"expected \(out, 3, k, k\)"):
        widen_stem_weight(torch.zeros(2, 4, 3, 3), 4)


def _offline_download(url: str, dst: str, *args: Any, **kwargs: Any) -> None:
    # What torch.hub's downloader raises on this machine without network (DNS failure).
    raise urllib.error.URLError(OSError(-2, "Name or service not known"))


@pytest.mark.parametrize("name", PRETRAINED_MODELS)
def test_pretrained_without_network_fails_clearly(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _offline_download)
    with pytest.raises(TrainingError) as info:
        build_model(name, num_classes=5, pretrained="imagenet")
    message = str(info.value)
    file_name = os.path.basename(WEIGHTS_OF[name].url)
    assert message.startswith(f"{name}: could not download ImageNet weights ")
    assert "Name or service not known" in message
    assert f"copy {file_name} into {tmp_path / 'torch' / 'hub' / 'checkpoints'}" in message
    assert "TORCH_HOME" in message
    assert "\n" not in message
    assert capsys.readouterr().out == ""  # torch.hub's "Downloading ..." line is not printed


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_corrupt_cached_weights_name_the_file_and_the_fix(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache file cut short (a copy interrupted) or overwritten: torch.hub trusts any file
    # it finds there, so the fault is the file, not the network.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _refuse_download)
    cached = corrupt_cache_file(tmp_path / "torch", tvm.ResNet18_Weights.IMAGENET1K_V1, damage)
    with pytest.raises(TrainingError) as info:
        build_model("unet_resnet18", num_classes=5, pretrained="imagenet")
    message = str(info.value)
    assert message.startswith(
        f"unet_resnet18: the cached ImageNet weights {cached} are truncated or corrupt ("
    )
    assert message.endswith(
        f"delete that file to download them again (or copy a good {cached.name} there)"
    )
    assert "\n" not in message


def test_train_with_corrupt_cached_weights_fails_in_one_line(
    tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _refuse_download)
    cached = corrupt_cache_file(tmp_path / "torch", tvm.ResNet18_Weights.IMAGENET1K_V1, "truncated")
    result = CliRunner().invoke(
        cli.main,
        [
            "train",
            tiny_store,
            "--out",
            str(tmp_path / "run"),
            "--model",
            "unet_resnet18",
            "--pretrained",
            "imagenet",
            "--epochs",
            "1",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: unet_resnet18: the cached ImageNet weights {cached} ")
    assert result.output.count("\n") == 1


def corrupt_cache_file(torch_home: Path, weights: tvm.WeightsEnum, damage: str) -> Path:
    """Write a damaged file where torch.hub caches `weights`."""
    cached = torch_home / "hub" / "checkpoints" / os.path.basename(weights.url)
    cached.parent.mkdir(parents=True)
    if damage == "truncated":
        torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, cached)
        cached.write_bytes(cached.read_bytes()[:20_000])
    else:
        cached.write_text("<html>503 Service Unavailable</html>")
    return cached


@pytest.fixture(scope="module")
def seeded_torch_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TORCH_HOME whose hub cache holds fake ImageNet files (random weights, real names)."""
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


def _refuse_download(url: str, dst: str, *args: Any, **kwargs: Any) -> None:
    raise AssertionError(f"test tried to download {url}")


@pytest.mark.slow
@pytest.mark.parametrize("name", PRETRAINED_MODELS)
def test_pretrained_from_seeded_cache_widens_stem(
    name: str, seeded_torch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(seeded_torch_home))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _refuse_download)
    file = seeded_torch_home / "hub" / "checkpoints" / os.path.basename(WEIGHTS_OF[name].url)
    fake = torch.load(file, weights_only=True)
    model = build_model(name, num_classes=5, pretrained="imagenet")
    stem_key = "features.0.0.weight" if "mobilenet" in name else "conv1.weight"
    rgb = fake[stem_key]
    stem = stem_conv(model, 4).weight.detach()
    torch.testing.assert_close(stem[:, :3], rgb)
    torch.testing.assert_close(stem[:, 3], rgb.mean(dim=1))
    # A deep encoder tensor arrives unchanged too (not just the stem).
    own = model.state_dict()
    if "mobilenet" in name:
        deep_key, own_key = "features.16.0.weight", "net.backbone.16.0.weight"
    elif name.startswith("unet"):
        deep_key, own_key = "layer4.1.conv1.weight", "encoder.layer4.1.conv1.weight"
    else:
        deep_key, own_key = "layer4.1.conv1.weight", "net.backbone.layer4.1.conv1.weight"
    torch.testing.assert_close(own[own_key], fake[deep_key])
    assert model(torch.randn(2, 4, 64, 64)).shape == (2, 5, 64, 64)
