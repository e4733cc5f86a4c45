"""Exported models (landcover.models.export, `landcover export`): ONNX and TorchScript files carry
the model file's metadata, keep batch/height/width dynamic, and predict the classes PyTorch does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import rasterio
import torch
from click.testing import CliRunner

from landcover import cli
from landcover.errors import ExportError, ModelFileError, PredictionError
from landcover.models.export import load_torchscript, model_digest, model_kind, require_onnx
from landcover.models.modelfile import (
    load_model_file,
    meta_to_json,
    read_model_file,
    save_model_file,
)
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from tests.landcover.prediction.inputs import pixels, write_image, write_model

# Two sizes that are not multiples of small_unet's stride (8) nor of each other.
SIZES = ((2, 4, 32, 32), (1, 4, 45, 37))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random-init small_unet (seed 7) as model.pt, ONNX and TorchScript (exported once).

    Its head's bias is centred on the scene's mean logits, so no class wins everywhere and the
    map has class boundaries, where runtimes could disagree.
    """
    root = tmp_path_factory.mktemp("export")
    pt = write_model(root / "model.pt", seed=7)
    model, meta = load_model_file(pt)
    x = (torch.from_numpy(pixels(96, 96, seed=3)).float()[None] - 110.0) / 60.0
    with torch.no_grad():
        head: Any = model.head
        head.bias.sub_(model(x).mean(dim=(0, 2, 3)))
    save_model_file(pt, model, meta)
    out = {"pt": pt, "onnx": root / "model.onnx", "torchscript": root / "model.torchscript"}
    for fmt in ("onnx", "torchscript"):
        result = CliRunner().invoke(
            cli.main, ["export", str(pt), "--format", fmt, "--out", str(out[fmt])]
        )
        assert result.exit_code == 0, result.output
        assert f"wrote {out[fmt]}: small_unet as {fmt}" in result.output
    return out


def _torch_logits(pt: Path, x: torch.Tensor) -> torch.Tensor:
    model, _ = load_model_file(pt)
    with torch.no_grad():
        logits: torch.Tensor = model(x)
    return logits


def test_onnx_file_carries_the_metadata_and_runs_at_two_sizes(models: dict[str, Path]) -> None:
    proto = onnx.load(str(models["onnx"]))
    props = {p.key: p.value for p in proto.metadata_props}
    meta, _ = read_model_file(models["pt"])
    assert json.loads(props["landcover"]) == meta_to_json(meta)
    assert props["landcover_model_sha256"] == model_digest(str(models["pt"]))  # its source
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [18]
    session = ort.InferenceSession(str(models["onnx"]), providers=["CPUExecutionProvider"])
    (graph_input,) = session.get_inputs()
    assert (graph_input.name, graph_input.shape) == ("pixels", ["batch", 4, "height", "width"])
    for shape in SIZES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        (logits,) = session.run(None, {"pixels": x.numpy()})
        assert logits.shape == (shape[0], 5, *shape[2:])
        np.testing.assert_allclose(logits, _torch_logits(models["pt"], x).numpy(), atol=1e-4)


def test_torchscript_file_carries_the_metadata_and_runs_at_two_sizes(
    models: dict[str, Path],
) -> None:
    module, meta = load_torchscript(str(models["torchscript"]))
    assert meta == read_model_file(models["pt"])[0]
    for shape in SIZES:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            torch.testing.assert_close(module(x), _torch_logits(models["pt"], x))


def test_model_kind_tells_the_three_files_apart(models: dict[str, Path]) -> None:
    assert {kind: model_kind(str(path)) for kind, path in models.items()} == {
        "pt": "model",
        "onnx": "onnx",
        "torchscript": "torchscript",
    }


def test_exported_models_predict_the_classes_pytorch_does(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """onnxruntime and TorchScript against PyTorch on a 150 x 170 px scene: at least 99.9 % of
    the pixels get the same class."""
    scene = write_image(tmp_path / "scene.tif", pixels(150, 170, seed=3))
    classes = {}
    for kind, path in models.items():
        out = tmp_path / f"{kind}.tif"
        predict_region(PredictConfig(str(path), (str(scene),), str(out), device="cpu"))
        with rasterio.open(out) as ds:
            classes[kind] = ds.read(1)
    counts = np.bincount(classes["pt"].ravel(), minlength=5)
    assert (counts[1:] > 0.05 * counts.sum()).sum() >= 3, counts  # boundaries to agree on
    for kind in ("onnx", "torchscript"):
        agreement = float((classes[kind] == classes["pt"]).mean())
        assert agreement >= 0.999, (kind, agreement)


def test_export_refuses_to_overwrite_without_the_flag(
    models: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "m.torchscript"
    out.write_bytes(b"keep me")
    args = ["export", str(models["pt"]), "--format", "torchscript", "--out", str(out)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert f"{out} exists; pass --overwrite to replace it" in result.output
    assert out.read_bytes() == b"keep me"
    result = CliRunner().invoke(cli.main, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert model_kind(str(out)) == "torchscript"
    assert not list(tmp_path.glob(".m.torchscript.*"))  # no temp file left


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_into_a_directory_is_one_line_even_with_overwrite(
    models: dict[str, Path], tmp_path: Path, overwrite: bool
) -> None:
    (tmp_path / "kept.txt").write_text("the user's")
    args = ["export", str(models["pt"]), "--format", "onnx", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli.main, args + ["--overwrite"] * overwrite)
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --out {tmp_path} is a directory; give a file name like {tmp_path}/model.onnx\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def test_backend_that_cannot_run_the_file_is_refused(models: dict[str, Path]) -> None:
    with pytest.raises(PredictionError, match="is an ONNX file; use --backend onnxruntime"):
        predict_region(
            PredictConfig(str(models["onnx"]), ("x.tif",), "o.tif", device="cpu", backend="torch")
        )


def test_onnx_file_without_landcover_metadata_is_refused(
    models: dict[str, Path], tmp_path: Path
) -> None:
    proto = onnx.load(str(models["onnx"]))
    del proto.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(proto, str(bare))
    scene = write_image(tmp_path / "scene.tif", pixels(40, 40, seed=4))
    with pytest.raises(ModelFileError, match="ONNX file without landcover metadata; export it"):
        predict_region(PredictConfig(str(bare), (str(scene),), str(tmp_path / "o.tif")))
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    with pytest.raises(ModelFileError, match="not a readable ONNX model"):
        predict_region(PredictConfig(str(junk), (str(scene),), str(tmp_path / "o.tif")))


def test_missing_onnx_library_names_what_to_install() -> None:
    with pytest.raises(
        ExportError,
        match=r"no_such_onnx_lib is not installed; pip install onnx onnxruntime onnxscript "
        r"\(dependencies of landcover\)",
    ):
        require_onnx("no_such_onnx_lib")
