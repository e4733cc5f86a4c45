"""The evaluation's pictures: a panel per scene (imagery | truth | prediction | disagreement),
classes.png and report.html, rendered in headless Chromium; their overwrite policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
from affine import Affine
from click.testing import CliRunner, Result

from landcover.cli.app import main
from landcover.evaluation.panels import AGREE_RGB, DISAGREE_RGB, ScenePanel
from tests.browser import render
from tests.landcover.view.maps import (
    FIVE,
    RES_M,
    UTM,
    X0,
    Y0,
    class_blocks,
    write_map,
    write_scene,
)

HEIGHT, WIDTH = 120, 200


def write_truth(path: Path, codes: npt.NDArray[np.uint8], x0: float) -> Path:
    """`codes` as raw Chesapeake truth at 1 m (each map pixel is 2 x 2 truth pixels)."""
    raw = np.repeat(np.repeat(codes, 2, axis=0), 2, axis=1)
    raw = np.where(raw == 4, 5, raw).astype(np.uint8)  # raw 5 is remapped to class 4
    raw[raw == 0] = 15  # raw nodata
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=raw.shape[1],
        height=raw.shape[0],
        count=1,
        dtype="uint8",
        crs=UTM,
        transform=Affine(1.0, 0, x0, 0, -1.0, Y0),
    ) as dst:
        dst.write(raw, 1)
    return path


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    """A prediction recording its image, and two truth scenes (its left and right halves)
    that disagree with it on a block of the right one."""
    folder = tmp_path_factory.mktemp("panels")
    predicted = class_blocks(HEIGHT, WIDTH, seed=4)
    truth = predicted.copy()
    truth[8:40, 120:160] = np.where(truth[8:40, 120:160] == 1, 2, 1)
    scene = write_scene(folder / "scene.tif", HEIGHT * RES_M, WIDTH * RES_M)
    prediction = write_map(folder / "lc.tif", predicted, sources=[str(scene)])
    half = WIDTH // 2
    truths = [
        write_truth(folder / "truth_w.tif", truth[:, :half], X0),
        write_truth(folder / "truth_e.tif", truth[:, half:], X0 + half * RES_M),
    ]
    return prediction, scene, truths


def evaluate(prediction: Path, truths: list[Path], out: Path, *extra: str) -> Result:
    args = ["evaluate", str(prediction), *(a for t in truths for a in ("--truth", str(t)))]
    return CliRunner().invoke(main, [*args, "--out", str(out), *extra])


def test_report_html_in_chromium_shows_the_table_and_each_scenes_panel(
    chromium: Path,
    evaluated: tuple[Path, Path, list[Path]],
    tmp_path: Path,
) -> None:
    prediction, _, truths = evaluated
    out = tmp_path / "report"
    result = evaluate(prediction, truths, out)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "classes.png", "confusion.png", "metrics.json", "metrics.md", "panel-01.png",
        "panel-02.png", "report.html",
    ]  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    shown = render(
        chromium,
        out / "report.html",
        width=1300,
        height=1400,
        values={
            "rows": "Array.from(document.querySelectorAll('#classes tbody tr')).map(r =>"
            " Array.from(r.cells).slice(1).map(c => c.textContent))",
            "panels": "Array.from(document.querySelectorAll('figure.panel')).map(f => {"
            " const r = f.querySelector('img').getBoundingClientRect();"
            " return [f.textContent, r.left, r.top, r.right, r.bottom,"
            " f.querySelector('img').naturalWidth]; })",
        },
    )
    assert shown.errors == []
    assert all(u.startswith(("file:", "data:")) for u in shown.requests), shown.requests
    assert [row[:2] for row in shown.values["rows"]] == [
        [c["name"], f"{c['iou']:.4f}"] for c in metrics["classes"]
    ]
    captions = [p[0] for p in shown.values["panels"]]
    assert captions == ["truth_w.tif", "truth_e.tif"]
    for caption, left, top, right, bottom, natural in shown.values["panels"]:
        assert right - left == natural  # drawn at its own size: colours are exact
        if bottom > shown.screenshot.shape[0]:
            continue  # below the screenshot
        crop = panel_pixels(shown, left, top, right, bottom)
        for c in FIVE.classes[1:]:
            assert crop.has_colour(c.color), (caption, c.name)
        assert crop.has_colour(AGREE_RGB)
        assert crop.has_colour(DISAGREE_RGB) == (caption == "truth_e.tif")


class _Crop:
    def __init__(self, pixels: npt.NDArray[np.uint8]) -> None:
        self.pixels = pixels

    def has_colour(self, rgb: Any) -> bool:
        return int(np.all(self.pixels == np.asarray(rgb, dtype=np.uint8), axis=-1).sum()) >= 20


def panel_pixels(shown: Any, left: float, top: float, right: float, bottom: float) -> _Crop:
    """The screenshot's pixels of a panel's four pictures: between its title (the top 15 %)
    and its legend (the bottom 12 %), whose swatches hold the colours too."""
    height = bottom - top
    rows = slice(int(top + 0.16 * height), int(top + 0.87 * height))
    cols = slice(int(left) + 1, int(right) - 1)
    return _Crop(shown.screenshot[rows, cols])


def test_disagreement_is_red_where_both_have_a_class_and_differ() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 5, size=(30, 40)).astype(np.uint8)
    predicted = rng.integers(0, 5, size=(30, 40)).astype(np.uint8)
    rgb = ScenePanel("s", None, truth, predicted).disagreement()
    both = (truth > 0) & (predicted > 0)
    red = np.all(rgb == DISAGREE_RGB, axis=-1)
    grey = np.all(rgb == AGREE_RGB, axis=-1)
    np.testing.assert_array_equal(red, both & (truth != predicted))
    np.testing.assert_array_equal(grey, both & (truth == predicted))
    assert np.all(rgb[~both] == 255)


def test_panels_are_refused_over_an_earlier_report_without_overwrite(
    evaluated: tuple[Path, Path, list[Path]], tmp_path: Path
) -> None:
    prediction, _, truths = evaluated
    out = tmp_path / "report"
    out.mkdir()
    (out / "panel-07.png").write_bytes(b"mine")
    for panels in ("--panels", "--no-panels"):  # a report directory holds one report
        result = evaluate(prediction, truths[:1], out, panels)
        assert result.exit_code == 2
        assert result.output == (
            f"error: {out / 'panel-07.png'} exists; --out {out} is for one evaluation report: "
            "choose a new directory, or pass --overwrite to replace the evaluation report there\n"
        )
        assert sorted(p.name for p in out.iterdir()) == ["panel-07.png"]
    assert evaluate(prediction, truths[:1], out, "--no-panels", "--overwrite").exit_code == 0
    assert not (out / "panel-07.png").exists()  # nothing of the old report stays
