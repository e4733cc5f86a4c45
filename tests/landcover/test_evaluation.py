"""Evaluation: hand-computed metrics, truth on another grid, nodata, class maps, reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
from affine import Affine
from click.testing import CliRunner

from landcover import cli
from landcover.errors import EvaluationError
from landcover.evaluation import (
    EvaluateConfig,
    confusion_matrix,
    evaluate_prediction,
    scores_from_confusion,
    write_report,
)
from landcover.prediction.outgrid import TAG_CLASS_MAP
from tiling.classes import get_class_map

UTM = "EPSG:32618"
X0, Y0 = 400_000.0, 4_100_000.0
FIVE = get_class_map("chesapeake7to5")

# Prediction codes (0 = nodata) and Chesapeake raw truth (5, 6 → 4; 15 = nodata → 0).
PRED = np.array(
    [
        [1, 1, 2, 2, 0],
        [1, 1, 2, 3, 3],
        [4, 4, 2, 3, 3],
        [4, 1, 2, 3, 3],
    ],
    dtype=np.uint8,
)
TRUTH_RAW = np.array(
    [
        [1, 1, 2, 2, 2],
        [1, 2, 2, 3, 3],
        [5, 6, 2, 3, 15],
        [4, 1, 1, 3, 3],
    ],
    dtype=np.uint8,
)
# By hand, truth rows x predicted columns over the 18 pixels both label.
CONFUSION = [[4, 1, 0, 0], [1, 4, 0, 0], [0, 0, 5, 0], [0, 0, 0, 3]]


def write(
    path: Path,
    data: npt.NDArray[np.uint8],
    *,
    res: float = 1.0,
    x0: float = X0,
    y0: float = Y0,
    crs: str = UTM,
    nodata: float | None = None,
    tags: dict[str, str] | None = None,
) -> Path:
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=data.shape[1],
        height=data.shape[0],
        count=1,
        dtype="uint8",
        crs=crs,
        transform=Affine(res, 0, x0, 0, -res, y0),
        nodata=nodata,
    ) as dst:
        dst.write(data, 1)
        if tags:
            dst.update_tags(**tags)
    return path


def write_prediction(path: Path, data: npt.NDArray[np.uint8] = PRED) -> Path:
    tags = {TAG_CLASS_MAP: json.dumps(FIVE.to_json())}
    return write(path, data, nodata=0, tags=tags)


def test_confusion_matrix_ignores_nodata_on_either_side() -> None:
    truth = FIVE.apply(TRUTH_RAW)
    assert confusion_matrix(truth, PRED, 5).tolist() == CONFUSION


def test_metrics_match_hand_computation(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    assert ev.confusion.tolist() == CONFUSION
    assert ev.pixels == 18
    assert ev.pixel_accuracy == pytest.approx(16 / 18)
    water, trees, low, barren = ev.classes
    assert (water.iou, water.precision, water.recall, water.f1) == pytest.approx(
        (4 / 6, 0.8, 0.8, 0.8)
    )
    assert (trees.iou, trees.precision, trees.recall) == pytest.approx((4 / 6, 0.8, 0.8))
    assert (low.iou, barren.iou, barren.f1) == pytest.approx((1.0, 1.0, 1.0))
    assert (water.truth_pixels, water.predicted_pixels, barren.truth_pixels) == (5, 5, 3)
    assert ev.mean_iou == pytest.approx((4 / 6 + 4 / 6 + 1 + 1) / 4)
    # Frequency-weighted: IoU weighted by each class's share of the truth pixels.
    assert ev.frequency_weighted_iou == pytest.approx((5 * 4 / 6 + 5 * 4 / 6 + 5 + 3) / 18)
    assert ev.truth_class_map == "chesapeake7to5"


def test_absent_class_has_no_iou_and_is_left_out_of_the_mean() -> None:
    confusion = np.array([[3, 1, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0], [1, 0, 0, 1]], dtype=np.int64)
    ev = scores_from_confusion(confusion, FIVE)
    assert ev.classes[2].iou is None and ev.classes[2].precision is None
    assert ev.classes[3].precision == pytest.approx(1.0) and ev.classes[3].recall == 0.5
    ious = [3 / 5, 2 / 3, 1 / 2]
    assert ev.mean_iou == pytest.approx(sum(ious) / 3)
    with pytest.raises(EvaluationError, match="no pixel has both a prediction and a truth label"):
        scores_from_confusion(np.zeros((4, 4), dtype=np.int64), FIVE)


def test_truth_on_a_finer_grid_is_warped_with_nearest_and_its_nodata_ignored(
    tmp_path: Path,
) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    # 0.5 m truth reaching 2 m beyond the prediction on every side; the margin holds codes a
    # nearest-neighbour read must never mix in, and one 2x2 block is the raster's nodata.
    fine = np.kron(TRUTH_RAW, np.ones((2, 2), dtype=np.uint8))
    padded = np.full((fine.shape[0] + 8, fine.shape[1] + 8), 6, dtype=np.uint8)
    padded[4:-4, 4:-4] = fine
    padded[4:6, 4:6] = 200  # truth nodata over prediction pixel (0, 0)
    truth = write(tmp_path / "truth.tif", padded, res=0.5, x0=X0 - 2, y0=Y0 + 2, nodata=200)
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    expected = np.array(CONFUSION)
    expected[0, 0] -= 1  # pixel (0, 0), water/water, is truth nodata now
    assert ev.confusion.tolist() == expected.tolist()


def test_truth_in_another_crs_is_warped_onto_the_prediction(tmp_path: Path) -> None:
    # A uniform truth in Web Mercator covering the whole prediction.
    pred = write_prediction(tmp_path / "pred.tif")
    from rasterio.warp import transform_bounds

    left, bottom, right, top = transform_bounds(
        UTM, "EPSG:3857", X0 - 10, Y0 - 14, X0 + 15, Y0 + 10
    )
    size = 40
    res = max(right - left, top - bottom) / size
    truth = write(
        tmp_path / "t.tif",
        np.full((size, size), 3, np.uint8),
        res=res,
        x0=left,
        y0=top,
        crs="EPSG:3857",
    )
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    assert ev.pixels == int((PRED > 0).sum())
    # Truth is all "low vegetation": the 6 pixels predicted so are right, the rest missed.
    assert ev.classes[2].precision == pytest.approx(1.0)
    assert ev.classes[2].recall == pytest.approx(6 / ev.pixels)


def test_prediction_without_tags_uses_chesapeake7to5_and_class_map_option(tmp_path: Path) -> None:
    pred = write(tmp_path / "pred.tif", PRED, nodata=0)
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    assert ev.confusion.tolist() == CONFUSION
    codes = write(tmp_path / "codes.tif", FIVE.apply(TRUTH_RAW))
    same = evaluate_prediction(EvaluateConfig(str(pred), (str(codes),), class_map="identity"))
    assert same.confusion.tolist() == CONFUSION
    assert same.truth_class_map == "identity"


def run(*args: str) -> Any:
    return CliRunner().invoke(cli.main, ["evaluate", *args])


def test_cli_writes_json_markdown_and_png(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    out = tmp_path / "report"
    result = run(str(pred), "--truth", str(truth), "--out", str(out))
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


def test_truth_that_does_not_overlap(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    far = write(tmp_path / "far.tif", TRUTH_RAW, x0=X0 + 5000)
    result = run(str(pred), "--truth", str(far))
    assert result.exit_code == 2
    assert result.output.startswith("error: truth (far.tif) does not overlap the prediction")


def test_truth_codes_outside_the_class_map(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    nlcd = write(tmp_path / "nlcd.tif", np.full((4, 5), 41, np.uint8))
    result = run(str(pred), "--truth", str(nlcd))
    assert result.exit_code == 2
    assert "label values [41] are not in class map 'chesapeake7to5'" in result.output
    ok = run(str(pred), "--truth", str(nlcd), "--class-map", "nlcd", "--json")
    assert ok.exit_code == 0, ok.output
    # 41 (deciduous forest) is tree canopy; every pixel the prediction labels counts.
    assert json.loads(ok.output)["classes"][1]["truth_pixels"] == int((PRED > 0).sum())


def test_class_map_with_other_classes_than_the_prediction(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    result = run(str(pred), "--truth", str(truth), "--class-map", "chesapeake7")
    assert result.exit_code == 2
    assert "--class-map chesapeake7 has 6 classes but the prediction's table" in result.output


def test_write_report_is_atomic_per_file(tmp_path: Path) -> None:
    pred = write_prediction(tmp_path / "pred.tif")
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    ev = evaluate_prediction(EvaluateConfig(str(pred), (str(truth),)))
    paths = write_report(ev, tmp_path / "r")
    assert [p.name for p in paths] == ["metrics.json", "metrics.md", "confusion.png"]
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("tagged", [True, False])
def test_predicted_codes_outside_the_class_table_are_an_error(tmp_path: Path, tagged: bool) -> None:
    # Codes 5 and 9 are not in the 5-code table: dropping those pixels scored the rest alone
    # (accuracy 1.0 here, where a third of the map is wrong).
    bad = PRED.copy()
    bad[0, :2] = 9
    bad[3, 3:] = 5
    path = tmp_path / "pred.tif"
    pred = write_prediction(path, bad) if tagged else write(path, bad, nodata=0)
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    result = run(str(pred), "--truth", str(truth))
    assert result.exit_code == 2
    table = "its class table" if tagged else "the class table 'chesapeake7to5' assumed"
    assert result.output.startswith(f"error: {pred}: holds class codes 5, 9 outside {table}")
    assert "(codes 0-4); leaving those pixels out would inflate the scores" in result.output
    assert result.output.count("\n") == 1


def test_confusion_matrix_refuses_codes_it_cannot_count() -> None:
    with pytest.raises(ValueError, match="predicted codes reach 7, not below 5"):
        confusion_matrix(FIVE.apply(TRUTH_RAW), np.full_like(PRED, 7), 5)


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
