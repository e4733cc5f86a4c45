"""Reading windows (tiling.sources.reader): valid-pixel masks, invalid pixels as 0, labels aligned
onto an image's grid (mosaicked, warped, remapped)."""

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
    full_window,
    write_raster,
)
from tiling.errors import LabelError
from tiling.sources.classes import get_class_map
from tiling.sources.rasters import open_image, open_label
from tiling.sources.reader import RasterReader, _any_band_differs, _any_band_nonzero

NO_NODATA_TAG = "m_4112001_sw_10_060_20220716.tif"


# --- image pixels -----------------------------------------------------------------------


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


def test_the_zero_mask_is_any_band_differing_from_zero() -> None:
    pixels = np.random.default_rng(4).integers(0, 2, size=(4, 30, 41), dtype=np.uint8)
    pixels[:, :5] = 0  # every band 0
    pixels[3, 5:7] = 9  # NIR alone set
    mask = _any_band_nonzero(pixels)
    assert mask.dtype == np.bool_ and not mask[:5].any() and mask[5:7].all()
    assert np.array_equal(mask, _any_band_differs(pixels, np.uint8(0)))
    assert np.array_equal(mask, pixels.any(axis=0))


# --- labels -----------------------------------------------------------------------------


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


def test_chesapeake_codes_fixture_is_what_it_claims() -> None:
    # guards the oracle above: every raw code maps through chesapeake7 to itself
    cmap = get_class_map("chesapeake7")
    assert np.array_equal(cmap.apply(CHESAPEAKE_RAW), CHESAPEAKE_RAW)
