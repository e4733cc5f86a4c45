"""GDAL's own words for a failed read (issue 41: "Read failed. See previous exception")."""

from __future__ import annotations

from pathlib import Path

import pytest
import rasterio
import rasterio.shutil

from tests.tiling.rasters import image_pixels, write_raster
from tiling.runtime.gdal import gdal_reason, open_failed


def test_a_missing_vrt_member_is_named(tmp_path: Path) -> None:
    member = write_raster(tmp_path / "member.tif", image_pixels(20, 30, seed=1))
    rasterio.shutil.copy(member, tmp_path / "scene.vrt", driver="VRT")
    member.unlink()
    with (
        rasterio.open(tmp_path / "scene.vrt") as src,
        pytest.raises(rasterio.errors.RasterioIOError) as failed,
    ):
        src.read()
    assert "See previous exception" in str(failed.value)
    assert gdal_reason(failed.value) == f"{member}: No such file or directory"
    assert open_failed(failed.value)


def test_an_error_without_causes_is_its_own_reason() -> None:
    assert gdal_reason(ValueError("  bad\n  value ")) == "bad value"
    assert gdal_reason(ValueError()) == "ValueError"
    assert not open_failed(ValueError("bad"))
