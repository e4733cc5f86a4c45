"""The suite's ONNX export memo (tests/support/exportmemo.py): the exporter runs once per key,
a different model or opset is exported for real, and a test's fake exporter is never kept."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.exportmemo import ExportMemo

PROPS = {"landcover": "{}", "landcover_model_sha256": "a" * 64}


class Recorder:
    """A stand-in for the exporter call: writes the call's number into the file."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self,
        graph: torch.nn.Module,
        example: torch.Tensor,
        path: str,
        opset: int,
        props: Mapping[str, str],
    ) -> int:
        self.calls += 1
        Path(path).write_text(f"export {self.calls}")
        return opset


def run(memo: ExportMemo, out: Path, **change: Any) -> str:
    props = {**PROPS, **change.get("props", {})}
    example = change.get("example", torch.zeros(2, 4, 64, 64))
    opset = change.get("opset", 18)
    assert memo(torch.nn.Identity(), example, str(out), opset, props) == opset
    return out.read_text()


def test_the_same_key_is_exported_once_and_copied_after(tmp_path: Path) -> None:
    recorder = Recorder()
    memo = ExportMemo(tmp_path / "memo", recorder, torch.onnx.export)
    assert run(memo, tmp_path / "a.onnx") == "export 1"
    assert run(memo, tmp_path / "b.onnx") == "export 1"
    assert (recorder.calls, memo.hits) == (1, 1)


@pytest.mark.parametrize(
    "change",
    [
        {"props": {"landcover_model_sha256": "b" * 64}},
        {"props": {"landcover": '{"chip_size": 32}'}},
        {"opset": 20},
        {"example": torch.zeros(2, 4, 32, 32)},
    ],
    ids=["model", "metadata", "opset", "example"],
)
def test_another_model_or_option_is_exported_for_real(
    change: dict[str, Any], tmp_path: Path
) -> None:
    recorder = Recorder()
    memo = ExportMemo(tmp_path / "memo", recorder, torch.onnx.export)
    run(memo, tmp_path / "a.onnx")
    assert run(memo, tmp_path / "b.onnx", **change) == "export 2"


def test_a_replaced_exporter_is_called_and_its_file_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    memo = ExportMemo(tmp_path / "memo", recorder, torch.onnx.export)
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: None)
    assert run(memo, tmp_path / "a.onnx") == "export 1"
    monkeypatch.undo()
    assert run(memo, tmp_path / "b.onnx") == "export 2"  # the fake's file was not kept
    assert list((tmp_path / "memo").iterdir()) != []  # the real one is
