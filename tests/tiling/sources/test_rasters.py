"""Opening and validating rasters, expanding inputs, matching labels to images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.windows

from tests.tiling.rasters import (
    ORIGIN_E,
    ORIGIN_N,
    Scenes,
    full_window,
    image_pixels,
    write_raster,
)
from tiling.errors import LabelError, SourceFormatError, SourceNotFoundError
from tiling.sources.labels import match_labels
from tiling.sources.rasters import expand_inputs, open_image, open_label
from tiling.sources.reader import RasterReader

ALPHA_NIR = ("m_3211605_ne_11_060_20200415.tif", "m_4208701_ne_16_060_20200902.tif")
NODATA_ZERO = "m_3610332_se_13_060_20200903-downsampled.tif"


# --- expanding inputs -----------------------------------------------------------------


def test_globs_directories_and_files_expand_sorted_and_deduplicated(scenes: Scenes) -> None:
    naip = scenes.root / "naip"
    found = expand_inputs([str(naip / "b.tif"), str(naip / "*.tif"), str(naip)])
    assert found == (str(naip / "b.tif"), str(naip / "a.tif"))


def test_a_glob_matching_nothing_names_the_pattern_and_the_fix(tmp_path: Path) -> None:
    pattern = str(tmp_path / "naip" / "*.tif")
    with pytest.raises(
        SourceNotFoundError,
        match=r"no image files match '.*naip/\*\.tif'; "
        r"check the path \(quote globs",
    ):
        expand_inputs([pattern])


# --- validating images ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bands": 3}, r"bad.tif: expected 4 bands \(R, G, B, NIR\), found 3"),
        ({"dtype": "uint16"}, r"bad.tif: expected uint8 pixels, found uint16; convert to 8-bit"),
        ({"crs": None}, r"bad.tif: has no CRS; assign one"),
    ],
)
def test_unusable_images_are_refused_with_the_reason(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    data = image_pixels(40, 50, seed=0, bands=int(kwargs.get("bands", 4)))  # type: ignore[call-overload]
    data = data.astype(str(kwargs.get("dtype", "uint8")))
    path = write_raster(tmp_path / "bad.tif", data, crs=kwargs.get("crs", "EPSG:26918"))  # type: ignore[arg-type]
    with pytest.raises(SourceFormatError, match=message):
        open_image(str(path))


def test_a_corrupt_tiff_is_named(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.tif"
    good = write_raster(tmp_path / "good.tif", image_pixels(40, 50, seed=0))
    path.write_bytes(good.read_bytes()[:200])
    with pytest.raises(
        SourceFormatError,
        match=r"corrupt.tif: not a readable GeoTIFF \(.*\); "
        "re-download it or leave it out",
    ):
        open_image(str(path))


def test_real_naip_files_open_and_alpha_tagged_nir_is_not_a_mask(
    real_naip_paths: list[Path],
) -> None:
    infos = {p.name: open_image(str(p)) for p in real_naip_paths}
    assert len(infos) == 6
    for name in ALPHA_NIR:
        # no nodata tag and no mask of their own: the zero-fill rule, never the alpha band
        assert infos[name].mask_kind == "zero"
        assert open_image(str(infos[name].path), zero_is_nodata=False).mask_kind == "none"
    assert infos[NODATA_ZERO].mask_kind == "nodata"
    reader = RasterReader()
    try:
        for name in ALPHA_NIR:
            info = infos[name]
            pixels, valid = reader.read_image(info, full_window(info))
            assert valid.all(), "NIR tagged as alpha must not mask pixels"
            with rasterio.open(info.path) as ds:
                assert np.array_equal(pixels[3], ds.read(4))
            # the dataset mask GDAL would derive from the alpha band is not all-valid here,
            # so the test would catch a reader that used it
            with rasterio.open(info.path) as ds:
                assert not (ds.dataset_mask() == 255).all()
        info = infos[NODATA_ZERO]
        pixels, valid = reader.read_image(info, full_window(info))
        assert np.array_equal(valid, (pixels != 0).any(axis=0))
    finally:
        reader.close()


def test_a_file_without_geotransform_gives_our_error_and_no_rasterio_warning(
    tmp_path: Path,
) -> None:
    import warnings

    path = tmp_path / "plain.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # writing one warns too; only the reading matters
        with rasterio.open(
            path, "w", driver="GTiff", width=40, height=30, count=4, dtype="uint8"
        ) as ds:
            ds.write(image_pixels(30, 40, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        with pytest.raises(SourceFormatError, match=r"plain.tif: has no CRS; assign one"):
            open_image(str(path))


# --- labels -----------------------------------------------------------------------------


def test_labels_are_matched_by_footprint_not_by_name(scenes: Scenes) -> None:
    a, b = (open_image(str(p)) for p in scenes.images)
    tiles = [open_label(str(p)) for p in scenes.chesapeake]  # tile_1 (east), tile_0 (west)
    nlcd = open_label(str(scenes.nlcd))
    assert [t.path for t in match_labels(a, tiles)] == [str(p) for p in scenes.chesapeake]
    assert [t.path for t in match_labels(b, tiles)] == [str(scenes.chesapeake[0])]
    assert match_labels(b, [nlcd]) == (nlcd,)


def test_labels_that_overlap_no_image_are_refused(scenes: Scenes, tmp_path: Path) -> None:
    far = write_raster(
        tmp_path / "far.tif",
        np.ones((20, 20), dtype=np.uint8),
        transform=rasterio.transform.from_origin(ORIGIN_E + 50_000, ORIGIN_N, 1, 1),
    )
    image = open_image(str(scenes.images[0]))
    with pytest.raises(
        LabelError,
        match=r"a.tif: no label raster overlaps it \(image bounds "
        r"370000, 4299700, 370413, 4300000 in EPSG:26918\); pass --labels",
    ):
        match_labels(image, [open_label(str(far))])


def test_multiband_labels_are_refused(tmp_path: Path) -> None:
    path = write_raster(tmp_path / "rgb_labels.tif", image_pixels(20, 20, seed=0, bands=3))
    with pytest.raises(
        LabelError, match=r"rgb_labels.tif: expected 1 band of class codes, found 3"
    ):
        open_label(str(path))
