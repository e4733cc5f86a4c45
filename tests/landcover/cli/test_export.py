"""`landcover export` as a user runs it: the ONNX opset is one the installed exporter writes and
the file's opset is the one asked for, and MODEL must be a model.pt (the round trips of the
exported files are tested in tests/landcover/models/test_export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from click.testing import Result
from onnx import TensorProto, helper

from tests.landcover.prediction.inputs import write_model
from tests.support.cli import invoke
from tests.support.exported import write_torchscript

NEWEST_OPSET = int(onnx.defs.onnx_opset_version())


@pytest.fixture(scope="module")
def model_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("export-cli") / "model.pt", seed=3)


def error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    (line,) = result.stderr.splitlines()
    return line


def file_opset(path: Path) -> int:
    proto = onnx.load(str(path))
    return next(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("opset", [7, 17, NEWEST_OPSET + 1, 99])
def test_an_opset_the_exporter_cannot_write_is_refused_before_the_model_loads(
    opset: int, tmp_path: Path
) -> None:
    out = tmp_path / "m.onnx"
    missing = tmp_path / "missing.pt"  # never opened: the opset is checked first
    args = ["export", str(missing), "--format", "onnx", "--opset", str(opset), "--out", str(out)]
    line = error_line(invoke(*args))
    assert line == (
        f"error: --opset {opset}: the installed exporter writes ONNX opsets 18 to "
        f"{NEWEST_OPSET}; choose one of them (default 18)"
    )
    assert not out.exists()


def test_the_file_has_the_opset_asked_for(model_pt: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    result = invoke(
        "export", str(model_pt), "--format", "onnx", "--opset", str(NEWEST_OPSET), "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: small_unet as onnx, opset {NEWEST_OPSET}, " in result.output
    assert file_opset(out) == NEWEST_OPSET


def test_an_opset_the_converter_could_not_reach_is_refused_and_nothing_written(
    model_pt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter's version converters log a failure and keep opset 18: the file is not
    put in place under a name that promises another opset."""

    def export_at_18(module: Any, args: Any, path: str, **kwargs: Any) -> None:
        value = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, None)
        logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
        node = helper.make_node("Identity", ["pixels"], ["logits"])
        graph = helper.make_graph([node], "g", [value], [logits])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)

    monkeypatch.setattr(torch.onnx, "export", export_at_18)
    out = tmp_path / "m.onnx"
    result = invoke("export", str(model_pt), "--format", "onnx", "--opset", "20", "--out", str(out))
    assert error_line(result) == (
        "error: --opset 20: the ONNX version converter could not convert the graph (it stays "
        "at opset 18); choose another --opset, e.g. 18"
    )
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temp file


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_an_exported_file_as_model_names_the_model_pt_to_export(
    kind: str, model_pt: Path, tmp_path: Path
) -> None:
    if kind == "onnx":
        exported = tmp_path / "model.onnx"
        exported.write_bytes(b"an onnx file")
    else:
        exported = write_torchscript(tmp_path / "model.ts")
    out = tmp_path / "again.onnx"
    line = error_line(invoke("export", str(exported), "--format", "onnx", "--out", str(out)))
    name = "ONNX" if kind == "onnx" else "TorchScript"
    assert line == (
        f"error: {exported} is an exported {name} file; export takes a landcover model file: "
        "give the model.pt of its training run (RUN_DIR/model.pt from `landcover train`)"
    )
    assert not out.exists()
