"""The model behind a prediction (landcover.prediction.runtime): an exported file whose graph
does not match its metadata, or whose metadata is damaged, is one line naming the file when it
loads; a runtime that cannot run the file says what will (the round trips of exported files
are tested in tests/landcover/models/test_export.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.errors import ModelFileError, PredictionError
from landcover.prediction.runtime import load_window_model
from tests.landcover.prediction.inputs import CHIP, CLASS_MAP, pixels, write_image, write_model
from tests.support.exported import META, write_onnx, write_torchscript

CPU = torch.device("cpu")


def test_a_matching_graph_loads(tmp_path: Path) -> None:
    model, meta = load_window_model(
        str(write_onnx(tmp_path / "m.onnx", bands=4, classes=5)), device=CPU
    )
    assert meta == META
    assert model(torch.zeros(1, 4, 8, 8)).shape == (1, 5, 8, 8)


@pytest.mark.parametrize(
    ("bands", "classes", "role", "shape", "expected"),
    [
        (3, 5, "input 'pixels'", "['batch', 3, 'h', 'w']", "4 bands (red, green, blue, nir)"),
        (4, 7, "output 'logits'", "['batch', 7, 'h', 'w']", "5 classes (chesapeake7to5)"),
    ],
)
def test_a_graph_that_does_not_match_its_metadata_is_refused_when_it_loads(
    bands: int, classes: int, role: str, shape: str, expected: str, tmp_path: Path
) -> None:
    path = write_onnx(tmp_path / "m.onnx", bands=bands, classes=classes)
    count = expected.split()[0]
    with pytest.raises(ModelFileError) as caught:
        load_window_model(str(path), device=CPU)
    assert str(caught.value) == (
        f"{path}: the ONNX graph's {role} has shape {shape}, but its landcover metadata says "
        f"(batch, {count}, height, width) for {expected}; the graph and the metadata are of "
        "different models: export it again from the model.pt of its training run "
        "(RUN_DIR/model.pt from `landcover train`)"
    )


def test_predict_with_a_mismatched_graph_is_one_line_before_any_work(tmp_path: Path) -> None:
    model = write_onnx(tmp_path / "m.onnx", bands=3, classes=5)
    scene = write_image(tmp_path / "scene.tif", pixels(40, 45, seed=1))
    out = tmp_path / "lc.tif"
    result = CliRunner().invoke(main, ["predict", str(model), str(scene), "--out", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {model}: the ONNX graph's input 'pixels' has shape ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "scene.tif"]


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_metadata_that_is_not_json_is_called_corrupt_and_located(kind: str, tmp_path: Path) -> None:
    if kind == "onnx":
        path = write_onnx(tmp_path / "m.onnx", bands=4, classes=5, metadata='{"format": ')
        holder = "metadata_props 'landcover'"
    else:
        path = write_torchscript(tmp_path / "m.ts", metadata='{"format": ')
        holder = "extra file landcover.json"
    with pytest.raises(ModelFileError) as caught:
        load_window_model(str(path), device=CPU)
    assert str(caught.value) == (
        f"{path}: its landcover metadata ({holder}) is corrupt, not JSON (Expecting value at "
        "character 11); export it again from the model.pt of its training run "
        "(RUN_DIR/model.pt from `landcover train`)"
    )


def test_onnxruntime_on_a_torchscript_file_advises_commands_that_work(tmp_path: Path) -> None:
    path = write_torchscript(tmp_path / "model.ts")
    with pytest.raises(PredictionError) as caught:
        load_window_model(str(path), backend="onnxruntime", device=CPU)
    message = str(caught.value)
    assert message == (
        f"--backend onnxruntime runs ONNX files and model files, not {path} (a TorchScript "
        "file); run it with --backend torch, or export the model.pt of its training run "
        "(RUN_DIR/model.pt from `landcover train`) with `landcover export RUN_DIR/model.pt "
        "--format onnx --out model.onnx`"
    )
    assert f"landcover export {path}" not in message  # export takes model.pt files only
    _, meta = load_window_model(str(path), backend="torch", device=CPU)  # the advice works
    assert meta == META


@pytest.mark.parametrize("windows", [1, 3, 17])
def test_a_torch_model_gives_the_same_logits_at_any_thread_count(
    windows: int, tmp_path: Path
) -> None:
    """The ranks of a job share a machine's cores, so each runs the model on fewer threads
    than one process: its logits must not change with the count (on one thread, torch runs
    small batches of small_unet's 1x1 head through another kernel)."""
    model, _ = load_window_model(str(write_model(tmp_path / "m.pt", seed=7)), device=CPU)
    batch = torch.randn(windows, 4, CHIP, CHIP, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    logits = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            logits[threads] = model(batch)
    finally:
        torch.set_num_threads(before)
    assert logits[1].shape == (windows, CLASS_MAP.num_classes, CHIP, CHIP)
    assert torch.equal(logits[1], logits[2]) and torch.equal(logits[3], logits[2])
