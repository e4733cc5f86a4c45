"""smp models through the commands: `landcover models`, and `--model smp:ARCH:ENCODER` through
train (one worker, and two with gradient compression or block momentum), export (TorchScript
and ONNX) and predict (with TTA, and as two ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner

from landcover import cli
from landcover.models import catalog
from landcover.models.registry import available, build_model
from landcover.tuning.space import parse_space
from tests.landcover.prediction.inputs import pixels, write_image

# timm's test EfficientNet under a Segformer head: 0.46 M parameters, seconds to train
SMP_MODEL = "smp:Segformer:tu-test_efficientnet"


def test_models_lists_registered_and_smp_models_with_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one curated encoder keeps it quick: each architecture is still built once
    monkeypatch.setattr(catalog, "CURATED_ENCODERS", ("resnet18",))
    monkeypatch.setattr(catalog, "CURATED_PAIRS", ())
    result = CliRunner().invoke(cli.main, ["models", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    counts = {m["name"]: m["parameters"] for m in listed["models"]}
    assert set(available()) <= set(counts)
    assert {"Unet", "UnetPlusPlus", "FPN", "DeepLabV3Plus", "Segformer"} <= set(
        listed["smp_architectures"]
    )
    assert "smp:UnetPlusPlus:resnet18" in counts and "smp:DPT:resnet18" not in counts  # ViTs only
    for name in ("small_unet", "smp:FPN:resnet18"):
        model = build_model(name, in_channels=4, num_classes=listed["num_classes"])
        assert counts[name] == sum(p.numel() for p in model.parameters()), name
    assert counts["unet_resnet18"] == counts["smp:Unet:resnet18"]  # the same network

    result = CliRunner().invoke(cli.main, ["models", "--encoders"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert {"resnet34", "efficientnet-b0", "mit_b0"} <= set(lines)
    assert lines[-1].startswith("tu-NAME: any timm model")


@pytest.mark.slow  # trains, exports to ONNX and predicts an smp U-Net
def test_smp_model_trains_exports_and_predicts(tiny_store: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        cli.main,
        ["train", tiny_store, "--out", str(run_dir), "--model", SMP_MODEL, "--epochs", "1",
         "--batch-size", "8", "--device", "cpu", "--threads", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    model = run_dir / "model.pt"
    files = {"torch": model}
    for fmt in ("torchscript", "onnx"):
        files[fmt] = tmp_path / f"model.{fmt}"
        result = CliRunner().invoke(
            cli.main, ["export", str(model), "--format", fmt, "--out", str(files[fmt])]
        )
        assert result.exit_code == 0, result.output
        assert f"{SMP_MODEL} as {fmt}" in result.output
    scene = write_image(tmp_path / "scene.tif", pixels(90, 110, seed=3))
    classes = {}
    for kind, path in files.items():
        out = tmp_path / f"{kind}.tif"
        # the same windows for every file (--window auto gives an ONNX file larger ones)
        args = ["predict", str(path), str(scene), "--out", str(out), "--device", "cpu",
                "--tta", "flips", "--window", "chip"]  # fmt: skip
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 0, result.output
        with rasterio.open(out) as ds:
            classes[kind] = ds.read(1)
            assert ds.shape == (90, 110)
    for fmt in ("torchscript", "onnx"):
        agreement = float(np.mean(classes[fmt] == classes["torch"]))
        assert agreement >= 0.999, (fmt, agreement)


def test_bad_smp_model_fails_train_in_one_line_before_loading(
    tiny_store: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli.main,
        ["train", tiny_store, "--out", str(tmp_path / "run"), "--model", "smp:Unet:resnet33",
         "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: smp:Unet:resnet33: smp has no encoder 'resnet33'")
    assert result.output.count("\n") == 1
    assert not (tmp_path / "run" / "model.pt").exists()


def test_tune_space_takes_smp_model_names() -> None:
    space = parse_space(f"model=small_unet|{SMP_MODEL},lr=1e-4:1e-2:log")
    assert str(space) == f"model=small_unet|{SMP_MODEL},lr=0.0001:0.01:log"
    assert parse_space(str(space)) == space


@pytest.mark.slow  # two training processes for each kind
@pytest.mark.parametrize(
    "comm", [("--compression", "powersgd:1"), ("--compression", "onebit"), ("--block-momentum",)]
)
def test_smp_model_trains_on_two_workers_with_every_kind_of_communication(
    tiny_store: str, tmp_path: Path, comm: tuple[str, ...]
) -> None:
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        cli.main,
        ["train", tiny_store, "--out", str(run_dir), "--model", SMP_MODEL, "--epochs", "1",
         "--batch-size", "4", "--device", "cpu", "--nproc", "2", *comm],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (run_dir / "model.pt").is_file()
    if comm[-1] != "onebit":
        return
    scene = write_image(tmp_path / "scene.tif", pixels(90, 110, seed=3))
    outs = {}
    for ranks in ("1", "2"):
        outs[ranks] = tmp_path / f"ranks-{ranks}.tif"
        args = ["predict", str(run_dir / "model.pt"), str(scene), "--out", str(outs[ranks]),
                "--device", "cpu", "--block-px", "48", "--nproc", ranks,
                "--no-quicklook"]  # fmt: skip
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 0, result.output
    with rasterio.open(outs["1"]) as one, rasterio.open(outs["2"]) as two:
        assert np.array_equal(one.read(), two.read())
