"""Comparing a prediction with truth (landcover.evaluation.compare): truth on another grid or
CRS, nodata, class maps, codes outside the class table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from landcover.evaluation import (
    EvaluateConfig,
    evaluate_prediction,
)
from tests.landcover.evaluation.maps import (
    CONFUSION,
    FIVE,
    PRED,
    TRUTH_RAW,
    UTM,
    X0,
    Y0,
    run,
    write,
    write_prediction,
)


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


def test_a_map_without_a_crs_says_so_and_how_to_fix_it(tmp_path: Path) -> None:
    pred = write(tmp_path / "pred.tif", PRED, nodata=0, crs=None)  # type: ignore[arg-type]
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    result = run(str(pred), "--truth", str(truth))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {pred}: the map has no CRS, so it cannot be laid over the truth; assign the CRS "
        f"it was predicted in (e.g. gdal_edit.py -a_srs EPSG:26918 {pred}) or pass the output of "
        "`landcover predict`, which has one\n"
    )


def test_a_prediction_that_is_not_one_band_of_uint8_is_one_line(tmp_path: Path) -> None:
    pred = tmp_path / "pred.tif"
    profile = {"driver": "GTiff", "width": PRED.shape[1], "height": PRED.shape[0], "count": 1}
    transform = Affine(1.0, 0.0, X0, 0.0, -1.0, Y0)
    with rasterio.open(pred, "w", **profile, dtype="float32", crs=UTM, transform=transform) as ds:
        ds.write(PRED.astype(np.float32), 1)
    truth = write(tmp_path / "truth.tif", TRUTH_RAW)
    result = run(str(pred), "--truth", str(truth))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {pred}: expected a 1-band uint8 land-cover map (found 1 band(s) of float32); "
        "pass the output of `landcover predict`\n"
    )
