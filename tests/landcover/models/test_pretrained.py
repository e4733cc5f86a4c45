"""Pretrained encoder weights (landcover.models.pretrained): read from local files and caches
only, never the network; 4-band stems; weights of another encoder refused in one line."""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision.models as tvm
from click.testing import CliRunner

from landcover import cli
from landcover.errors import TrainingError
from landcover.models.pretrained import widen_stem_weight
from landcover.models.registry import build_model
from tests.landcover.models.model_names import PRETRAINED_MODELS, WEIGHTS_OF, stem_conv

# One model per way of loading weights: torchvision's ResNet into smp's Unet, torchvision's
# ResNet-50 backbone, torchvision's MobileNet features, and smp's own encoder loading.
LOADERS = ["unet_resnet18", "fcn_resnet50", "lraspp_mobilenet_v3_large", "smp:Unet:resnet18"]
CACHE_NOTE = "never downloads them; place "


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Empty torch hub and Hugging Face caches, and every way out to the network (sockets,
    urllib, torch.hub's and huggingface_hub's downloaders) recording the attempt and failing.
    The list holds the attempts: a test asserts it stays empty."""
    import huggingface_hub
    import segmentation_models_pytorch.encoders as smp_encoders
    from huggingface_hub import constants

    attempts: list[str] = []

    def refuse(what: str) -> Any:
        def blocked(*args: Any, **kwargs: Any) -> None:
            attempts.append(f"{what}{args[:1]}")
            raise OSError(f"test: no network ({what})")

        return blocked

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
    monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urlopen"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse("torch.hub download"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse("hf_hub_download"))
    monkeypatch.setattr(smp_encoders, "hf_hub_download", refuse("hf_hub_download"))
    return attempts


@pytest.mark.parametrize("name", [*PRETRAINED_MODELS, "smp:Unet:resnet18"])
def test_imagenet_without_a_cached_file_is_refused_and_nothing_is_fetched(
    name: str, no_network: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: `--pretrained imagenet` for unet_resnet* and the torchvision models downloaded
    from the internet, against the docs. Now every model reads a local cache only, and without
    the file refuses in one line naming it and where it goes; no connection is attempted."""
    with pytest.raises(TrainingError) as info:
        build_model(name, num_classes=5, pretrained="imagenet")
    message = str(info.value)
    assert no_network == []
    assert message.startswith(f"{name}: ImageNet weights are not in the ") and "\n" not in message
    assert CACHE_NOTE in message and "--pretrained PATH" in message
    if name in WEIGHTS_OF:
        file_name = os.path.basename(WEIGHTS_OF[name].url)
        cached = tmp_path / "torch" / "hub" / "checkpoints" / file_name
        assert f"place {file_name} (from {WEIGHTS_OF[name].url}) at {cached} " in message
        assert "TORCH_HOME" in message
    else:
        assert str(tmp_path / "hf" / "hub" / "models--smp-hub--resnet18.imagenet") in message
    assert capsys.readouterr().out == ""


def test_train_with_imagenet_and_no_cache_is_one_line_and_leaves_nothing(
    tiny_store: str, no_network: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["train", tiny_store, "--out", str(out), "--model", "unet_resnet18",
            "--pretrained", "imagenet", "--epochs", "1", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2 and no_network == []
    assert result.output.startswith("error: unet_resnet18: ImageNet weights are not in the torch ")
    assert result.output.count("\n") == 1 and not out.exists()


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_corrupt_cached_weights_name_the_file_and_the_fix(
    damage: str, no_network: list[str], tmp_path: Path
) -> None:
    # A cache file cut short (a copy interrupted) or overwritten: torch.hub trusts any file
    # it finds there, so the fault is the file, not the network.
    cached = corrupt_cache_file(tmp_path / "torch", tvm.ResNet18_Weights.IMAGENET1K_V1, damage)
    with pytest.raises(TrainingError) as info:
        build_model("unet_resnet18", num_classes=5, pretrained="imagenet")
    message = str(info.value)
    assert message.startswith(
        f"unet_resnet18: the cached ImageNet weights {cached} are truncated or corrupt ("
    )
    assert message.endswith(f"replace that file by a good copy of {cached.name}")
    assert "\n" not in message and no_network == []


def test_train_with_corrupt_cached_weights_fails_in_one_line(
    tiny_store: str, no_network: list[str], tmp_path: Path
) -> None:
    cached = corrupt_cache_file(tmp_path / "torch", tvm.ResNet18_Weights.IMAGENET1K_V1, "truncated")
    result = CliRunner().invoke(
        cli.main,
        ["train", tiny_store, "--out", str(tmp_path / "run"), "--model", "unet_resnet18",
         "--pretrained", "imagenet", "--epochs", "1", "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: unet_resnet18: the cached ImageNet weights {cached} ")
    assert result.output.count("\n") == 1


def corrupt_cache_file(torch_home: Path, weights: tvm.WeightsEnum, damage: str) -> Path:
    """Write a damaged file where torch.hub caches `weights`."""
    cached: Path = torch_home / "hub" / "checkpoints" / os.path.basename(weights.url)
    cached.parent.mkdir(parents=True)
    if damage == "truncated":
        torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, cached)
        cached.write_bytes(cached.read_bytes()[:20_000])
    else:
        cached.write_text("<html>503 Service Unavailable</html>")
    return cached


@pytest.mark.slow
@pytest.mark.parametrize("name", PRETRAINED_MODELS)
def test_pretrained_from_seeded_cache_widens_stem(
    name: str, seeded_torch_home: Path, no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(seeded_torch_home))
    file = seeded_torch_home / "hub" / "checkpoints" / os.path.basename(WEIGHTS_OF[name].url)
    fake = torch.load(file, weights_only=True)
    model = build_model(name, num_classes=5, pretrained="imagenet")
    assert no_network == []
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


# -- weights that are not the encoder's ---------------------------------------------------------


def encoder_weights(name: str) -> dict[str, torch.Tensor]:
    """The state dict of the ImageNet file (torchvision's layout) that model `name` reads."""
    factory = {
        "resnet18": tvm.resnet18,
        "resnet34": tvm.resnet34,
        "resnet50": tvm.resnet50,
        "mobilenet_v3_large": tvm.mobilenet_v3_large,
        "mobilenet_v3_small": tvm.mobilenet_v3_small,
    }[name]
    return dict(factory(weights=None).state_dict())


# model -> (its own encoder's weights, another encoder's weights)
ENCODERS = {
    "unet_resnet18": ("resnet18", "resnet34"),
    "fcn_resnet50": ("resnet50", "resnet18"),
    "lraspp_mobilenet_v3_large": ("mobilenet_v3_large", "mobilenet_v3_small"),
    "smp:Unet:resnet18": ("resnet18", "resnet34"),
}


def reshaped(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """`state` with one deep conv weight of another shape (the right keys, wrong shapes)."""
    key = [k for k, v in state.items() if v.ndim == 4][5]
    changed = dict(state)
    changed[key] = torch.zeros(state[key].shape[0] // 2, *state[key].shape[1:])
    return changed, key


# smp's imagenet weights come from the Hugging Face cache, tested in test_smp_models
SOURCES = [
    (name, source)
    for name in LOADERS
    for source in ("file", "imagenet cache")
    if source == "file" or not name.startswith("smp:")
]


@pytest.mark.parametrize("fault", ["another encoder", "wrong shapes"])
@pytest.mark.parametrize(("name", "source"), SOURCES)
def test_weights_that_are_not_the_encoders_are_refused_in_one_line(
    name: str, fault: str, source: str, no_network: list[str], tmp_path: Path
) -> None:
    """issue 41: another encoder's weights (resnet34's for resnet18) loaded without a word, and
    the right keys with other shapes were an internal error. Both are one line naming the
    file, the first tensor that does not fit, and the fix, from a file and from the cache."""
    own, other = ENCODERS[name]
    if fault == "another encoder":
        state, key = encoder_weights(other), ""
    else:
        state, key = reshaped(encoder_weights(own))
    if source == "file":
        path = tmp_path / "encoder.pth"
    else:
        path = tmp_path / "torch" / "hub" / "checkpoints" / os.path.basename(WEIGHTS_OF[name].url)
        path.parent.mkdir(parents=True)
    torch.save(state, path)
    pretrained = str(path) if source == "file" else "imagenet"
    with pytest.raises(TrainingError) as info:
        build_model(name, num_classes=5, pretrained=pretrained)
    message = str(info.value)
    assert message.startswith(f"{name}: the pretrained ") and str(path) in message
    assert "\n" not in message and no_network == []
    assert message.endswith(
        "give the weights of this encoder (--pretrained PATH), or leave out --pretrained"
    )
    if fault == "wrong shapes":
        # named as the encoder names it (MobileNet's features are its backbone)
        key = key.removeprefix("features.")
        assert f"the pretrained tensor {key} of {path} has shape " in message
    else:
        assert " tensors that the encoder does not have (first: " in message or " miss " in message


@pytest.mark.parametrize("name", ["unet_resnet18", "fcn_resnet50", "smp:Unet:resnet18"])
def test_a_landcover_model_of_the_same_encoder_starts_the_encoder(
    name: str, no_network: list[str], tmp_path: Path
) -> None:
    """A whole model's state dict (4-band stem, as a landcover model.pt holds it) gives its
    encoder's tensors, stem included, unchanged."""
    torch.manual_seed(0)
    trained = build_model(name, num_classes=3)
    path = tmp_path / "model.pth"
    torch.save({"state_dict": trained.state_dict()}, path)
    torch.manual_seed(1)
    model = build_model(name, num_classes=5, pretrained=str(path))
    prefix = "encoder." if "unet" in name.lower() else "net.backbone."
    encoder = {k: v for k, v in trained.state_dict().items() if k.startswith(prefix)}
    own = model.state_dict()
    for key, value in encoder.items():
        torch.testing.assert_close(own[key], value, rtol=0, atol=0)
    assert no_network == []


@pytest.mark.parametrize("pretrained", ["weights", "weights/"])
def test_a_pretrained_directory_is_named_as_one(
    pretrained: str, tiny_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 41: a directory given to --pretrained read as "not known" or "not found"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    expected = f"--pretrained {pretrained} is a directory; give the weights file in it ("
    with pytest.raises(TrainingError) as info:
        build_model("unet_resnet18", num_classes=5, pretrained=pretrained)
    assert str(info.value).startswith(expected)
    args = ["train", tiny_store, "--out", "run", "--model", "unet_resnet18",
            "--pretrained", pretrained, "--epochs", "1", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2 and result.output.startswith(f"error: {expected}")
    assert result.output.count("\n") == 1


REFUSED = [
    ("small_unet", "imagenet", "small_unet has no pretrained weights; leave out --pretrained"),
    ("unet_resnet18", "coco", "--pretrained 'coco' is not known; give imagenet or the path of "),
]


@pytest.mark.parametrize(("model", "pretrained", "message"), REFUSED)
def test_pretrained_refusals_speak_in_flags(
    model: str, pretrained: str, message: str, tiny_store: str, tmp_path: Path
) -> None:
    """issue 41: the CLI said `use pretrained=None`, the Python spelling."""
    with pytest.raises(TrainingError) as info:
        build_model(model, num_classes=5, pretrained=pretrained)
    assert str(info.value).startswith(message)
    args = ["train", tiny_store, "--out", str(tmp_path / "run"), "--model", model,
            "--pretrained", pretrained, "--epochs", "1", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2 and result.output.startswith(f"error: {message}")
    assert "pretrained=" not in result.output and "None" not in result.output


class _NotATensor:
    """An object torch.save pickles but a weights-only load refuses."""


def _cut_short(path: Path) -> None:
    """A weights file whose copy stopped after its first 200 bytes."""
    torch.save({"w": torch.zeros(3)}, path)
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.write_text("root:x:0:0:root:/root:/bin/bash\n"), "not a file written by"),
        (lambda p: p.write_bytes(bytes(range(101))), "not a file written by torch.save"),
        (lambda p: torch.save({"w": _NotATensor()}, p), "it holds objects other than tensors"),
        (_cut_short, "the file is truncated or corrupt: "),
    ],
    ids=["text", "bytes", "objects", "cut short"],
)
def test_an_unreadable_weights_file_says_why_in_a_users_words(
    tmp_path: Path, make: Any, reason: str
) -> None:
    """Before: torch's first words, such as '(list index out of range)' for a text file,
    '(101)' for bytes and '(Weights only load failed)'."""
    path = tmp_path / "weights.pt"
    make(path)
    with pytest.raises(TrainingError) as info:
        build_model("unet_resnet18", num_classes=5, pretrained=str(path))
    prefix = f"unet_resnet18: cannot read pretrained weights {path} ({reason}"
    assert str(info.value).startswith(prefix), str(info.value)
    assert "\n" not in str(info.value)
