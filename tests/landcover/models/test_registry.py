"""The model registry: one shared test class run against every registered architecture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from landcover import cli
from landcover.errors import UnknownModelError
from landcover.models.registry import available, build_model
from tests.landcover.models.model_names import ALL_MODELS, stem_conv


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


@pytest.mark.parametrize("name", ["small_unet ", " unet_resnet18", "smp:Unet:resnet18\t"])
def test_a_model_name_with_spaces_around_it_is_refused_quoted(name: str) -> None:
    """issue 41: a trailing space in --model read as an unknown name with no hint. Refused,
    not stripped: the name is stored as given (run.json, model.pt)."""
    with pytest.raises(UnknownModelError) as info:
        build_model(name, num_classes=5)
    assert str(info.value).startswith(
        f"unknown model {name!r}: a model name has no spaces around it, write "
        f"{name.strip()!r}; choose one of: "
    )
    assert all(model in str(info.value) for model in ALL_MODELS)


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_cli_refuses_a_model_name_with_a_space_in_one_line(
    nproc: str, tiny_store: str, tmp_path: Path
) -> None:
    """In this process, and in the parent of 2 workers before any starts (no worker logs)."""
    args = ["train", tiny_store, "--out", str(tmp_path / "run"), "--model", "unet_resnet18 ",
            "--epochs", "1", "--device", "cpu", "--nproc", nproc]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert result.output.startswith("error: unknown model 'unet_resnet18 ': a model name has no ")
    assert result.output.count("\n") == 1 and "worker logs" not in result.output
    assert list(tmp_path.iterdir()) == []
