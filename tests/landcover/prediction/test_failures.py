"""Prediction that must fail cleanly: bad input (one line naming the value and the fix, exit 2,
nothing written) and runs stopped part-way (no temporary file left beside the output)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import rasterio
import torch
from click.testing import CliRunner
from rasterio.errors import NotGeoreferencedWarning
from rio_cogeo.cogeo import cog_validate

from landcover import cli
from landcover.errors import ModelFileError, OutputExistsError, PredictionError, RegionError
from landcover.models.modelfile import ModelMeta
from landcover.prediction.blockstages import BlockWriter, PredictedBlock
from landcover.prediction.config import PredictConfig
from landcover.prediction.gridwindow import Window
from landcover.prediction.outgrid import plan_output_grid
from landcover.prediction.runner import predict_region
from landcover.prediction.setup import check_model, open_images
from tests.landcover.prediction.inputs import (
    pipeline_threads,
    pixels,
    utm_region,
    write_image,
    write_model,
)
from tiling.sources.classes import identity_class_map

NOT_A_MODEL = "is not a landcover model file (model.pt from `landcover train`)"


# -- bad input -----------------------------------------------------------------------------------


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli.main, ["predict", *args, "--device", "cpu"])


def test_region_outside_all_images(scene: Path, constant_model: Path, tmp_path: Path) -> None:
    result = run_cli(
        str(constant_model),
        str(scene),
        "--out",
        str(tmp_path / "o.tif"),
        "--bbox",
        "10,50,10.1,50.1",
    )
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: region (10,50,10.1,50.1 in EPSG:4326) is outside all 1 images"
    )
    assert list(tmp_path.iterdir()) == []


def test_invalid_geojson(scene: Path, constant_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.geojson"
    bad.write_text('{"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[1, 2]')
    result = run_cli(
        str(constant_model), str(scene), "--out", str(tmp_path / "o.tif"), "--region", str(bad)
    )
    assert result.exit_code == 2
    assert "invalid GeoJSON" in result.output and result.output.count("\n") == 1


def test_region_that_holds_no_pixel_centre(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    # A sliver between two pixel-centre rows.
    region = utm_region(500_010.0, 3_999_950.6, 500_030.0, 3_999_950.9)
    with pytest.raises(RegionError, match="covers no pixel centre"):
        predict_region(
            PredictConfig(
                str(constant_model), (str(scene),), str(tmp_path / "o.tif"), region=region
            )
        )
    assert list(tmp_path.iterdir()) == []


def test_all_nodata_after_masking_leaves_no_output(constant_model: Path, tmp_path: Path) -> None:
    data = pixels(40, 40, seed=8)
    data[:, :, 15:] = 0  # nodata collar over the right part
    image = write_image(tmp_path / "a.tif", data, nodata=0)
    out_dir = tmp_path / "out"
    region = utm_region(500_020.0, 3_999_965.0, 500_039.0, 3_999_999.0)
    with pytest.raises(RegionError, match="no image pixel with data inside the region"):
        predict_region(
            PredictConfig(str(constant_model), (str(image),), str(out_dir / "o.tif"), region=region)
        )
    assert not out_dir.exists()  # temp files removed, and the directory made for them


def test_model_with_other_band_count(scene: Path, tmp_path: Path) -> None:
    model = write_model(tmp_path / "m3.pt", in_channels=3)
    result = run_cli(str(model), str(scene), "--out", str(tmp_path / "o.tif"))
    assert result.exit_code == 2
    assert "scene.tif: has 4 bands but model" in result.output
    assert "expects 3 (red, green, blue)" in result.output


def test_model_whose_class_table_does_not_fit_a_byte_raster(scene: Path, tmp_path: Path) -> None:
    model = write_model(tmp_path / "m.pt", class_map=identity_class_map(256))
    with pytest.raises(PredictionError, match="has 256 codes; a land-cover raster"):
        predict_region(PredictConfig(str(model), (str(scene),), str(tmp_path / "o.tif")))


def test_model_file_with_damaged_band_stats() -> None:
    meta = ModelMeta(
        architecture="small_unet",
        class_map=identity_class_map(5),
        band_names=("red", "green", "blue", "nir"),
        band_mean=(110.0,) * 3,
        band_std=(60.0,) * 4,
        chip_size=32,
        resolution_m=1.0,
    )
    with pytest.raises(
        PredictionError,
        match=r"^m\.pt: band stats have 3 means and 4 stds for 4 bands; the model file is dam",
    ):
        check_model("m.pt", meta)


def test_not_a_model_file(scene: Path, tmp_path: Path) -> None:
    fake = tmp_path / "model.pt"
    torch.save({"weights": torch.zeros(3)}, fake)  # a torch file, but not ours
    with pytest.raises(ModelFileError, match="not a landcover model file"):
        predict_region(PredictConfig(str(fake), (str(scene),), str(tmp_path / "o.tif")))
    fake.write_bytes(b"definitely not a torch file")
    result = run_cli(str(fake), str(scene), "--out", str(tmp_path / "o.tif"))
    assert result.exit_code == 2
    assert result.output == f"error: {fake} {NOT_A_MODEL}\n"
    assert not (tmp_path / "o.tif").exists()


def test_output_exists_without_overwrite(scene: Path, constant_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.tif"
    out.write_bytes(b"old")
    result = run_cli(str(constant_model), str(scene), "--out", str(out))
    assert result.exit_code == 2
    assert result.output == f"error: {out} exists; pass --overwrite to replace it\n"
    assert out.read_bytes() == b"old"
    with pytest.raises(OutputExistsError):
        predict_region(PredictConfig(str(constant_model), (str(scene),), str(out)))
    predict_region(PredictConfig(str(constant_model), (str(scene),), str(out), overwrite=True))
    assert cog_validate(str(out))[0]


def test_missing_images_and_conflicting_region_options(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    result = run_cli(
        str(constant_model), str(tmp_path / "none-*.tif"), "--out", str(tmp_path / "o.tif")
    )
    assert result.exit_code == 2 and "no image files match" in result.output
    result = run_cli(
        str(constant_model),
        str(scene),
        "--out",
        str(tmp_path / "o.tif"),
        "--bbox",
        "1,2,3,4",
        "--region",
        "POLYGON ((0 0, 1 0, 1 1, 0 0))",
    )
    assert result.exit_code == 2 and "either --region or --bbox" in result.output


# -- damaged inputs ------------------------------------------------------------------------------


def test_truncated_image_fails_naming_the_file(constant_model: Path, tmp_path: Path) -> None:
    # Uncompressed strips: the header and the first rows survive, a later read fails.
    whole = write_image(tmp_path / "whole.tif", pixels(120, 150, seed=9))
    data = whole.read_bytes()
    cut = tmp_path / "cut.tif"
    cut.write_bytes(data[: len(data) * 2 // 3])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run_cli(str(constant_model), str(cut), "--out", str(out_dir / "o.tif"))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {cut}: reading rows ")
    assert "the file is truncated or corrupt; re-download it or leave it out" in result.output
    assert result.output.count("\n") == 1
    assert list(out_dir.iterdir()) == []  # no half-written map, no temp files
    assert pipeline_threads() == []  # the reader thread that failed is gone


def test_error_while_writing_a_block_is_one_line_and_leaves_nothing(
    constant_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer thread fails on the third block (a full disk, say): the error comes up here,
    # once, and the reader and writer threads are gone.
    image = write_image(tmp_path / "image.tif", pixels(120, 150, seed=9))
    written: list[Window] = []

    def write(self: BlockWriter, predicted: PredictedBlock) -> None:
        if len(written) == 2:
            raise PredictionError(f"{out_dir}: no space left on the device")
        written.append(predicted.window)

    monkeypatch.setattr(BlockWriter, "__call__", write)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run_cli(
        str(constant_model), str(image), "--out", str(out_dir / "o.tif"), "--block-px", "32"
    )
    assert result.exit_code == 2, result.output
    assert result.output == f"error: {out_dir}: no space left on the device\n"
    assert list(out_dir.iterdir()) == []
    assert pipeline_threads() == []


@pytest.mark.parametrize("kind", ["text", "geotiff"])
def test_text_or_geotiff_given_as_the_model(kind: str, scene: Path, tmp_path: Path) -> None:
    if kind == "text":
        model = tmp_path / "model.txt"
        model.write_text("epochs: 10\nlr: 0.002\n")
    else:
        model = scene  # the image where the model belongs (arguments swapped)
    result = run_cli(str(model), str(scene), "--out", str(tmp_path / "o.tif"))
    assert result.exit_code == 2, result.output
    assert result.output == f"error: {model} {NOT_A_MODEL}\n"


def test_truncated_model_file_is_named_damaged(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "model.pt"
    cut.write_bytes(constant_model.read_bytes()[:50_000])
    result = run_cli(str(cut), str(scene), "--out", str(tmp_path / "o.tif"))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(
        f"error: {cut}: damaged landcover model file (truncated or corrupt"
    )
    assert result.output.count("\n") == 1


# -- outputs that cannot be written, grids that are too large -------------------------------------


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("/proc/lc.tif", "--out /proc/lc.tif: cannot create files in /proc ("),
        ("/proc/missing/lc.tif", "--out /proc/missing/lc.tif: cannot create files in /proc ("),
        ("{tmp}/file.txt/lc.tif", "--out {tmp}/file.txt/lc.tif: {tmp}/file.txt is not a directory"),
    ],
)
def test_unwritable_output_fails_before_any_work(
    out: str, message: str, scene: Path, tmp_path: Path
) -> None:
    (tmp_path / "file.txt").write_text("")
    out, message = out.format(tmp=tmp_path), message.format(tmp=tmp_path)
    # The model does not exist: the output is checked first, before anything is loaded.
    result = run_cli(str(tmp_path / "no-model.pt"), str(scene), "--out", out)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {message}")
    assert result.output.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_storage_options_for_local_paths_only_are_refused(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    """Local files take no storage options: a key given there was dropped without a word."""
    result = run_cli(
        str(constant_model), str(scene), "--out", str(tmp_path / "lc.tif"),
        "--storage-options", '{"account_key": "k"}',
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --storage-options (account_key) do not apply to local paths such as "
        f"{constant_model}; drop --storage-options, or use a URL such as az://container/path\n"
    )
    assert not (tmp_path / "lc.tif").exists()


def test_unwritable_probabilities_fail_too(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    result = run_cli(
        str(constant_model),
        str(scene),
        "--out",
        str(tmp_path / "lc.tif"),
        "--probabilities",
        "/proc/p.tif",
    )
    assert result.exit_code == 2
    assert result.output.startswith("error: --probabilities /proc/p.tif: cannot create files in")
    assert list(tmp_path.iterdir()) == []


def test_absurd_resolution_is_refused_before_planning_pixels(scene: Path) -> None:
    # 0.1 mm pixels over a 90 x 75 m scene: 675 gigapixels.
    with pytest.raises(PredictionError) as info:
        plan_output_grid(open_images([str(scene)]), None, resolution_m=1.0, resolution=0.0001)
    assert str(info.value) == (
        "output grid 900,000 x 750,000 px = 675 gigapixels at --resolution 0.0001 (EPSG:32618 "
        "units) is above the limit of 10 gigapixels; use a coarser --resolution or a smaller "
        "region, or raise --max-pixels if you mean it"
    )


def test_max_pixels_sets_the_limit(scene: Path, constant_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "lc.tif"
    # 0.5 m over the scene: 180 x 150 = 27,000 px.
    result = run_cli(
        str(constant_model),
        str(scene),
        "--out",
        str(out),
        "--resolution",
        "0.5",
        "--max-pixels",
        "20000",
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: output grid 180 x 150 px = 2.7e-05 gigapixels")
    assert "above the limit of 2e-05 gigapixels" in result.output
    assert list(tmp_path.iterdir()) == []
    result = run_cli(
        str(constant_model),
        str(scene),
        "--out",
        str(out),
        "--resolution",
        "0.5",
        "--max-pixels",
        "27000",
    )
    assert result.exit_code == 0, result.output
    with rasterio.open(out) as ds:
        assert (ds.width, ds.height) == (180, 150)


# -- warnings ------------------------------------------------------------------------------------


def test_benign_rasterio_warning_is_not_printed(constant_model: Path, tmp_path: Path) -> None:
    image = tmp_path / "plain.tif"
    with (
        warnings.catch_warnings(action="ignore", category=NotGeoreferencedWarning),
        rasterio.open(
            image, "w", driver="GTiff", width=40, height=30, count=4, dtype="uint8"
        ) as dst,
    ):  # no CRS, no geotransform
        dst.write(pixels(30, 40, seed=3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_cli(str(constant_model), str(image), "--out", str(tmp_path / "o.tif"))
    assert result.exit_code == 2
    assert result.output == (
        f"error: {image}: has no CRS; assign one (e.g. gdal_edit.py -a_srs EPSG:26918 {image})\n"
    )
    assert [str(w.message) for w in caught] == []


def test_warnings_while_predicting_go_to_the_log(
    scene: Path,
    constant_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def is_available() -> bool:  # what torch says on a machine with a broken CUDA driver
        warnings.warn(
            "CUDA initialization: CUDA unknown error - this may be due to an incorrectly set "
            "up environment",
            UserWarning,
            stacklevel=2,
        )
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        predict_region(
            PredictConfig(
                str(constant_model), (str(scene),), str(tmp_path / "o.tif"), device="auto"
            )
        )
    assert [str(w.message) for w in caught] == []
    logged = [r for r in caplog.records if r.name.startswith("landcover.")]
    assert [r.getMessage() for r in logged] == [
        "UserWarning: CUDA initialization: CUDA unknown error - this may be due to an "
        "incorrectly set up environment"
    ]
    assert logged[0].levelno == logging.WARNING


# -- stopped runs --------------------------------------------------------------------------------


def test_sigterm_mid_run_leaves_no_temp_files(constant_model: Path, tmp_path: Path) -> None:
    # ~1,000 windows run one at a time: seconds of work, stopped as soon as the temporary
    # tiles exist.
    image = write_image(tmp_path / "big.tif", pixels(400, 600, seed=4))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    command = [
        sys.executable,
        "-m",
        "landcover.cli.app",
        "predict",
        str(constant_model),
        str(image),
        "--out",
        str(out_dir / "lc.tif"),
        "--probabilities",
        str(out_dir / "p.tif"),
        "--device",
        "cpu",
        "--overlap",
        "16",
        "--batch-size",
        "1",
        "--block-px",
        "64",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out_dir.glob(".lc.tif.*.tiles.part.tif")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "predict never started writing"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # It exited by itself after cleaning up (a status > 0), not killed by the signal (-15),
    # and not finished (0).
    assert process.returncode > 0, stderr
    assert "Traceback" not in stderr
    assert list(out_dir.iterdir()) == []


def test_a_resolution_the_model_was_not_trained_near_is_one_line(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    """A 1 m model on 300 m pixels would map noise: refused before any window runs."""
    out = tmp_path / "lc.tif"
    result = run_cli(str(constant_model), str(scene), "--out", str(out), "--resolution", "300")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "error: --resolution 300 (300 m) is 300x coarser than the 1 m the model was trained at "
        "(more than 4x is refused); give a --resolution between 0.25 and 4 m, or none for the "
        "model's own (for a coarser map, read the COG's overviews)"
    )
    assert list(tmp_path.iterdir()) == []
