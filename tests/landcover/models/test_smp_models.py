"""smp models (`smp:ARCH:ENCODER`, landcover.models.smp_models): one shared test run against
one model of each family, pretrained encoders from local files only, and the hand-written
U-Net's model files loading into smp's Unet."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from landcover.errors import TrainingError, UnknownModelError
from landcover.models.export import export_model, load_torchscript
from landcover.models.modelfile import ModelMeta, load_model_file, read_model_file, save_model_file
from landcover.models.registry import build_model
from landcover.models.smp_models import check_chip_size
from tiling.sources.classes import get_class_map

# One model per family, on the smallest encoder that builds them all: timm's test network (a
# tiny EfficientNet). smp's own encoders (mit_b0, resnet18) appear in the pretrained tests.
FAMILIES = [
    "smp:Unet:tu-test_efficientnet",
    "smp:FPN:tu-test_efficientnet",
    "smp:DeepLabV3Plus:tu-test_efficientnet",
    "smp:Segformer:tu-test_efficientnet",
]
CLASS_MAP = get_class_map("chesapeake7to5")


def meta_for(name: str) -> ModelMeta:
    return ModelMeta(
        architecture=name,
        class_map=CLASS_MAP,
        band_names=("red", "green", "blue", "nir"),
        band_mean=(100.0,) * 4,
        band_std=(50.0,) * 4,
        chip_size=64,
        resolution_m=1.0,
    )


@pytest.mark.slow  # each family trains a few steps
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_trains_saves_and_loads(name: str, tmp_path: Path) -> None:
    """Logits of the input's size (any size: padded to the stride and cropped), a finite
    gradient in EVERY parameter (DDP without find_unused_parameters and every compression hook
    need one), a model file that rebuilds the same function from its architecture string
    with torch.load(weights_only=True), and a TorchScript export that computes it too."""
    torch.manual_seed(0)
    classes = CLASS_MAP.num_classes
    model = build_model(name, in_channels=4, num_classes=classes).train()
    x = torch.randn(2, 4, 70, 90)
    logits = model(x)
    assert logits.shape == (2, classes, 70, 90)
    target = torch.randint(0, classes, (2, 70, 90))
    nn.functional.cross_entropy(logits, target).backward()  # type: ignore[no-untyped-call]
    no_grad = [n for n, p in model.named_parameters() if p.grad is None]
    assert not no_grad, no_grad[:3]
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    stem = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert stem.in_channels == 4

    path = tmp_path / "model.pt"
    save_model_file(path, model, meta_for(name))
    assert read_model_file(path)[0].architecture == name
    loaded, _ = load_model_file(path)
    model.eval()
    traced = tmp_path / "model.torchscript"
    export_model(str(path), traced, format="torchscript")
    scripted, _ = load_torchscript(str(traced))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x[:1, :, :64, :64]), model(x[:1, :, :64, :64]))
        # traced at the chip size, it runs at others (padded to the stride inside)
        torch.testing.assert_close(scripted(x[:, :, :45, :37]), model(x[:, :, :45, :37]))
        expected = model(x[:, :, :45, :37]).numpy()
    onnx_path = tmp_path / "model.onnx"
    export_model(str(path), onnx_path, format="onnx")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run(None, {"pixels": x[:, :, :45, :37].numpy()})
    np.testing.assert_allclose(onnx_logits, expected, atol=1e-4)


def test_bad_smp_names_say_what_to_write() -> None:
    cases = {
        "smp:Unet": "'smp:Unet' is not an smp model name; write smp:ARCH:ENCODER",
        "smp:Unte:resnet34": "smp:Unte:resnet34: smp has no architecture 'Unte'; choose one "
        "of: Unet, UnetPlusPlus,",
        "smp:Unet:resnet33": "smp:Unet:resnet33: smp has no encoder 'resnet33' (did you mean "
        "resnet34?); `landcover models --encoders` lists them",
        "smp:FPN:tu-no_such_net": "smp has no encoder 'tu-no_such_net'",
    }
    for name, message in cases.items():
        with pytest.raises(UnknownModelError) as info:
            build_model(name, num_classes=5)
        assert message in str(info.value), str(info.value)
        assert "\n" not in str(info.value)
    # any case of the architecture is smp's class
    assert type(build_model("smp:fpn:tu-test_efficientnet", num_classes=2)).__name__ == "FPN"


def test_chip_size_must_be_a_multiple_of_the_output_stride() -> None:
    model = build_model("smp:DeepLabV3Plus:tu-test_efficientnet", num_classes=3)
    check_chip_size(model, "smp:DeepLabV3Plus:tu-test_efficientnet", 48)  # stride 16
    with pytest.raises(TrainingError) as info:
        check_chip_size(model, "smp:DeepLabV3Plus:tu-test_efficientnet", 100)
    assert str(info.value) == (
        "--model smp:DeepLabV3Plus:tu-test_efficientnet needs chips whose side is a multiple "
        "of 16 px (its encoder's output stride); the store's chips are 100 px: re-tile with "
        "--chip-size 96 or 112"
    )
    check_chip_size(build_model("small_unet", num_classes=3), "small_unet", 100)  # pads


def fresh_encoder_state(name: str) -> dict[str, torch.Tensor]:
    """An RGB encoder's state dict of a freshly initialised model (seed 5), as a weights file
    from ImageNet training would hold it."""
    torch.manual_seed(5)
    rgb = build_model(name, in_channels=3, num_classes=2)
    encoder: nn.Module = rgb.encoder  # type: ignore[assignment]
    return {k: v.clone() for k, v in encoder.state_dict().items()}


@pytest.mark.parametrize(
    ("name", "suffix"),
    [("smp:Segformer:mit_b0", ".safetensors"), ("smp:FPN:tu-test_efficientnet", ".pth")],
)
def test_pretrained_file_lands_in_the_encoder_with_smps_nir_rule(
    name: str, suffix: str, tmp_path: Path
) -> None:
    state = fresh_encoder_state(name)
    path = tmp_path / f"encoder{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"encoder." + k: v for k, v in state.items()}, path)  # a whole model's
    torch.manual_seed(6)
    model = build_model(name, in_channels=4, num_classes=5, pretrained=str(path))
    encoder: nn.Module = model.encoder  # type: ignore[assignment]
    own = encoder.state_dict()
    stem_key = next(k for k, v in own.items() if v.ndim == 4)
    for key, value in state.items():
        if key != stem_key:
            torch.testing.assert_close(own[key], value, rtol=0, atol=0)
    rgb = state[stem_key]
    # smp's patch_first_conv: band i takes RGB filter i mod 3, all scaled by 3 / bands
    expected = torch.cat([rgb, rgb[:, :1]], dim=1) * 3 / 4
    torch.testing.assert_close(own[stem_key], expected)


def test_pretrained_files_that_do_not_fit_fail_in_one_line(tmp_path: Path) -> None:
    name = "smp:FPN:tu-test_efficientnet"
    state = fresh_encoder_state(name)
    some = tmp_path / "partial.pth"
    torch.save(dict(list(state.items())[:3]), some)
    text = tmp_path / "notes.pt"
    text.write_text("not weights")
    cases = {
        str(tmp_path / "missing.pth"): f"{name}: pretrained weights file "
        f"{tmp_path / 'missing.pth'} not found; give the path of an encoder state dict",
        str(some): f"{name}: the pretrained weights {some} miss ",
        str(text): f"{name}: cannot read pretrained weights {text} (",
        "coco": "--pretrained 'coco' is not known; give imagenet or the path of an encoder "
        "weights file",
        str(tmp_path): f"--pretrained {tmp_path} is a directory; give the weights file in it",
    }
    for pretrained, message in cases.items():
        with pytest.raises(TrainingError) as info:
            build_model(name, num_classes=5, pretrained=pretrained)
        assert str(info.value).startswith(message), str(info.value)
        assert "\n" not in str(info.value)


def test_imagenet_comes_from_the_hf_cache_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing cached: one line naming the exact file to place. Placed there: it loads, and
    nothing tries to download (hf_hub_download fails the test)."""
    import huggingface_hub
    import segmentation_models_pytorch.encoders as smp_encoders
    from huggingface_hub import constants

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to download")

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    monkeypatch.setattr(smp_encoders, "hf_hub_download", no_download)
    name = "smp:Segformer:mit_b0"
    with pytest.raises(TrainingError) as info:
        build_model(name, num_classes=5, pretrained="imagenet")
    message = str(info.value)
    match = re.search(
        r"place model\.safetensors of smp-hub/mit_b0\.imagenet \(revision \w+\) at (\S+) ", message
    )
    assert match, message
    expected = Path(match[1])
    assert expected.is_relative_to(tmp_path / "hub" / "models--smp-hub--mit_b0.imagenet")
    assert "\n" not in message
    state = fresh_encoder_state(name)
    expected.parent.mkdir(parents=True)
    save_file(state, str(expected))
    model = build_model(name, num_classes=5, pretrained="imagenet")
    encoder: nn.Module = model.encoder  # type: ignore[assignment]
    own = encoder.state_dict()
    deep = [k for k in state if k.endswith("norm.weight")][-1]
    torch.testing.assert_close(own[deep], state[deep], rtol=0, atol=0)


def _hand_written_key(key: str) -> str:
    """smp Unet's key as the hand-written ResNet U-Net (before smp) named it."""
    match = re.match(r"decoder\.blocks\.(\d+)\.conv([12])\.(.*)", key)
    if match:
        return f"decoder.{match[1]}.block.{int(match[2]) - 1}.{match[3]}"
    return key.replace("segmentation_head.0.", "head.")


def test_model_file_of_the_hand_written_unet_resnet_still_loads(tmp_path: Path) -> None:
    """A model.pt saved by the hand-written unet_resnet18 (its decoder.<i>.block.<j> and head
    keys, written here by renaming the keys of a model) loads into smp's Unet with every
    tensor in place."""
    torch.manual_seed(3)
    model = build_model("unet_resnet18", num_classes=CLASS_MAP.num_classes).eval()
    old_state = {_hand_written_key(k): v for k, v in model.state_dict().items()}
    assert "head.weight" in old_state and "decoder.4.block.1.0.weight" in old_state
    path = tmp_path / "old.pt"
    payload = {**_meta_json("unet_resnet18"), "state_dict": old_state}
    torch.save(payload, path)
    loaded, meta = load_model_file(path)
    assert meta.architecture == "unet_resnet18"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    x = torch.randn(1, 4, 40, 56)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def _meta_json(name: str) -> dict[str, object]:
    from landcover.models.modelfile import meta_to_json

    return meta_to_json(meta_for(name))
