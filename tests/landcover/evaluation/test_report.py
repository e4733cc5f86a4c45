"""The evaluation report (landcover.evaluation.report): metrics.json, metrics.md, confusion.png,
through the CLI and the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from landcover.evaluation import (
    EvaluateConfig,
    evaluate_prediction,
    write_report,
)
from tests.landcover.evaluation.maps import (
    CONFUSION,
    FIVE,
    TRUTH_RAW,
    run,
    write,
    write_prediction,
)


def test_cli_writes_json_markdown_and_png(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    out = tmp_path / "report"
    result = run(str(pred), "--truth", str(truth), "--out", str(out), "--no-panels")
    assert result.exit_code == 0, result.output
    assert "| 1 | water | 0.6667 | 0.8000 | 0.8000 | 0.8000 | 5 | 5 |" in result.output
    assert "Pixel accuracy: 0.8889" in result.output
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["confusion_matrix"]["counts"] == CONFUSION
    assert saved["mean_iou"] == pytest.approx(10 / 12)
    assert "| 4 | barren / impervious | 1.0000 |" in (out / "metrics.md").read_text()
    assert (out / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["confusion.png", "metrics.json", "metrics.md"]
    again = run(str(pred), "--truth", str(truth), "--out", str(out))
    assert again.exit_code == 2
    assert again.output == f"error: {out / 'metrics.json'} exists; pass --overwrite to replace it\n"
    assert run(str(pred), "--truth", str(truth), "--out", str(out), "--overwrite").exit_code == 0


def test_cli_json_output(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    result = run(str(pred), "--truth", str(truth), "--json")
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.output)
    assert parsed["pixel_accuracy"] == pytest.approx(16 / 18)
    assert [c["name"] for c in parsed["classes"]] == FIVE.class_names[1:]


def test_write_report_is_atomic_per_file(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    paths = write_report(ev, tmp_path / "r")
    assert [p.name for p in paths] == ["metrics.json", "metrics.md", "confusion.png"]
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_out_naming_an_existing_file_is_refused_before_the_work(
    tmp_path: Path, overwrite: list[str]
) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    result = run(str(pred), "--truth", str(truth), "--out", str(taken), *overwrite)
    assert result.exit_code == 2
    assert result.output == (
        f"error: --out {taken}: exists and is not a directory; give a directory for "
        "metrics.json, metrics.md, confusion.png\n"
    )
    assert taken.read_text() == "mine"
