"""Opening and validating rasters, expanding inputs, matching and warping labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.windows
from pyproj import Transformer

from tests.tiling.rasters import (
    ALBERS,
    CHESAPEAKE_RAW,
    ORIGIN_E,
    ORIGIN_N,
    Scenes,
    image_pixels,
    write_raster,
)
from tiling.classes import get_class_map
from tiling.errors import LabelError, SourceFormatError, SourceNotFoundError
from tiling.sources import (
    RasterReader,
    expand_inputs,
    match_labels,
    open_image,
    open_label,
)

ALPHA_NIR = ("m_3211605_ne_11_060_20200415.tif", "m_4208701_ne_16_060_20200902.tif")
NODATA_ZERO = "m_3610332_se_13_060_20200903-downsampled.tif"
NO_NODATA_TAG = "m_4112001_sw_10_060_20220716.tif"


def full_window(info: object) -> rasterio.windows.Window:
    return rasterio.windows.Window(0, 0, info.width, info.height)  # type: ignore[attr-defined]


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


def test_nodata_pixels_are_those_with_every_band_at_nodata(scenes: Scenes, tmp_path: Path) -> None:
    info = open_image(str(scenes.images[1]))  # nodata 0, a 80 x 120 corner of zeros
    data = scenes.image_pixels[1].copy()
    data[3, 200:210, 200:210] = 0  # NIR 0 alone is data, not nodata
    one_band_zero = write_raster(tmp_path / "nir0.tif", data, transform=info.transform, nodata=0)
    reader = RasterReader()
    try:
        _, valid = reader.read_image(info, full_window(info))
        _, valid_nir0 = reader.read_image(open_image(str(one_band_zero)), full_window(info))
    finally:
        reader.close()
    expected = np.ones((257, 390), dtype=bool)
    expected[:80, :120] = False
    assert np.array_equal(valid, expected)
    assert np.array_equal(valid_nir0, expected)


def black_collared(real_naip_dir: Path, tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A real NAIP file without a nodata tag, given a black collar as NAIP quads have."""
    with rasterio.open(real_naip_dir / NO_NODATA_TAG) as ds:
        assert ds.nodata is None and not (ds.read() == 0).all(axis=0).any()
        data, profile = ds.read(), ds.profile
    data[:, :, :40] = 0  # the collar: 0 in every band
    data[:, 100:110, 100:110] = np.array([0, 0, 0, 50])[:, None, None]  # black RGB, NIR 50
    path = tmp_path / "collar.tif"
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(data)
    return path, data


def test_black_fill_is_nodata_when_a_file_declares_none(
    real_naip_dir: Path, tmp_path: Path
) -> None:
    path, data = black_collared(real_naip_dir, tmp_path)
    info = open_image(str(path))
    assert info.nodata is None and info.mask_kind == "zero"
    reader = RasterReader()
    try:
        pixels, valid = reader.read_image(info, full_window(info))
        kept = open_image(str(path), zero_is_nodata=False)
        _, valid_kept = reader.read_image(kept, full_window(kept))
    finally:
        reader.close()
    expected = np.ones(data.shape[1:], dtype=bool)
    expected[:, :40] = False
    assert np.array_equal(valid, expected)
    assert np.array_equal(pixels, data)
    assert valid_kept.all(), "--no-zero-nodata keeps black pixels as imagery"


def test_invalid_pixels_read_as_zero_in_every_band(scenes: Scenes, tmp_path: Path) -> None:
    data = scenes.image_pixels[0].copy()
    data[:, :30, :50] = 255  # declared nodata 255: stored as 255, must read as 0
    path = write_raster(tmp_path / "n255.tif", data, nodata=255)
    info = open_image(str(path))
    reader = RasterReader()
    try:
        pixels, valid = reader.read_image(info, full_window(info))
    finally:
        reader.close()
    assert not valid[:30, :50].any() and valid[30:].all()
    assert (pixels[:, ~valid] == 0).all()
    assert np.array_equal(pixels[:, valid], data[:, valid])


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


def test_same_crs_labels_are_mosaicked_exactly_first_raster_wins(scenes: Scenes) -> None:
    image = open_image(str(scenes.images[0]))
    tiles = [open_label(str(p)) for p in scenes.chesapeake]
    cmap = get_class_map("chesapeake7")
    reader = RasterReader()
    try:
        codes = reader.read_labels(image, full_window(image), tiles, cmap)
    finally:
        reader.close()
    # independent oracle: integer pixel offsets between the aligned 1 m grids
    with rasterio.open(scenes.chesapeake[0]) as east, rasterio.open(scenes.chesapeake[1]) as west:
        east_raw, west_raw = east.read(1), west.read(1)
    expected = np.zeros((300, 413), dtype=np.uint8)
    # west tile: x from E-10, y from N+10 → image (r, c) is (r + 10, c + 10) there, c < 250
    expected[:, :250] = cmap.apply(west_raw[10:310, 10:260])
    expected[:, 250:] = cmap.apply(east_raw[10:310, 0:163], nodata=15)
    assert np.array_equal(codes, expected)
    assert (codes[90:100, 250:] == 0).all()  # the nodata stripe of the east tile


def test_labels_in_another_crs_and_resolution_are_warped_with_nearest(scenes: Scenes) -> None:
    image = open_image(str(scenes.images[1]))
    nlcd = open_label(str(scenes.nlcd))
    cmap = get_class_map("nlcd")
    reader = RasterReader()
    try:
        codes = reader.read_labels(image, rasterio.windows.Window(7, 5, 300, 200), [nlcd], cmap)
        whole = reader.read_labels(image, full_window(image), [nlcd], cmap)
    finally:
        reader.close()
    # oracle: map every pixel centre into Albers with pyproj and look its 30 m cell up
    with rasterio.open(scenes.nlcd) as ds:
        raw = ds.read(1)
        inv = ~ds.transform
    rows, cols = np.mgrid[0:257, 0:390]
    xs, ys = image.transform @ (cols + 0.5, rows + 0.5)
    ax, ay = Transformer.from_crs("EPSG:26918", ALBERS, always_xy=True).transform(xs, ys)
    lc, lr = inv @ (ax, ay)
    expected = cmap.apply(raw[np.floor(lr).astype(int), np.floor(lc).astype(int)])
    # A centre within 1/1000 px of a cell edge may round either way in floating point;
    # every other pixel must match exactly, whole image and window alike.
    frac = np.stack([lr % 1, lc % 1])
    ambiguous = (np.minimum(frac, 1 - frac) < 1e-3).any(axis=0)
    assert not ((whole != expected) & ~ambiguous).any()
    assert not ((codes != expected[5:205, 7:307]) & ~ambiguous[5:205, 7:307]).any()
    assert ambiguous.mean() < 0.01
    assert len(np.unique(whole)) >= 4


def test_label_values_outside_the_class_map_are_named(scenes: Scenes, tmp_path: Path) -> None:
    bad = write_raster(
        tmp_path / "bad_labels.tif",
        np.full((310, 500), 9, dtype=np.uint8),
        transform=rasterio.transform.from_origin(ORIGIN_E - 10, ORIGIN_N + 10, 1, 1),
    )
    image = open_image(str(scenes.images[0]))
    reader = RasterReader()
    try:
        with pytest.raises(
            LabelError,
            match=r"bad_labels.tif: label values \[9\] are not in "
            r"class map 'chesapeake7to5'; choose another --class-map",
        ):
            reader.read_labels(
                image, full_window(image), [open_label(str(bad))], get_class_map("chesapeake7to5")
            )
    finally:
        reader.close()


def test_multiband_labels_are_refused(tmp_path: Path) -> None:
    path = write_raster(tmp_path / "rgb_labels.tif", image_pixels(20, 20, seed=0, bands=3))
    with pytest.raises(
        LabelError, match=r"rgb_labels.tif: expected 1 band of class codes, found 3"
    ):
        open_label(str(path))


def test_chesapeake_codes_fixture_is_what_it_claims() -> None:
    # guards the oracle above: every raw code maps through chesapeake7 to itself
    cmap = get_class_map("chesapeake7")
    assert np.array_equal(cmap.apply(CHESAPEAKE_RAW), CHESAPEAKE_RAW)
