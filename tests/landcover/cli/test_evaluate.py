"""`landcover evaluate DIR/`: a tiled product's directory is scored as its mosaic; another
directory is one line saying what to give (issue 41)."""

from __future__ import annotations

from pathlib import Path

import rasterio.shutil

from tests.landcover.evaluation.maps import TRUTH_RAW, run, write, write_prediction


def test_a_product_directory_is_scored_as_its_mosaic(tmp_path: Path) -> None:
    """Before: "prod/: cannot open the prediction ('prod/' not recognized as being in a
    supported file format.)"."""
    truth = write(tmp_path / "truth.tif", TRUTH_RAW, nodata=15)
    product = tmp_path / "prod"
    product.mkdir()
    tile = write_prediction(product / "E400000_N4100000.tif")
    rasterio.shutil.copy(tile, product / "mosaic.vrt", driver="VRT")
    as_mosaic = run(str(product / "mosaic.vrt"), "--truth", str(truth), "--class-map",
                    "chesapeake7to5", "--json")  # fmt: skip
    assert as_mosaic.exit_code == 0, as_mosaic.output
    as_directory = run(f"{product}/", "--truth", str(truth), "--class-map", "chesapeake7to5",
                       "--json")  # fmt: skip
    assert as_directory.exit_code == 0, as_directory.output
    assert as_directory.output == as_mosaic.output


def test_another_directory_says_what_to_give(tmp_path: Path) -> None:
    truth = write(tmp_path / "truth.tif", TRUTH_RAW, nodata=15)
    result = run(f"{tmp_path}/", "--truth", str(truth))
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: {tmp_path}/: a directory, not a land-cover raster; give the map (a GeoTIFF "
        "or a VRT), or a tiled product's directory (one that holds mosaic.vrt)"
    )
