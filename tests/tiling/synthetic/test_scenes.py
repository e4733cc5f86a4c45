"""Tests of the synthetic NAIP-like scene generator (tiling/synthetic/scenes.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
from rasterio.enums import ColorInterp
from rasterio.transform import rowcol, xy
from rasterio.warp import transform as transform_points

from tiling.errors import TilingError
from tiling.synthetic.scenes import SynthConfig, SynthResult, synthesize_scenes
from tiling.synthetic.world import FOREST

NAME = re.compile(r"^m_(\d{2})(\d{3})(\d{2})_(nw|ne|sw|se)_18_100_(\d{8})\.tif$")
CHESAPEAKE_CODES = {1, 2, 3, 4, 5, 6, 15}
# Chesapeake 7 -> 5 classes: water, tree canopy, low vegetation, barren + impervious (0 = nodata)
TO_FIVE = np.array([0, 1, 2, 3, 4, 4, 4] + [0] * 249, dtype=np.int64)


@dataclass(frozen=True)
class Scenes:
    result: SynthResult
    images: list[npt.NDArray[np.uint8]]
    labels: list[npt.NDArray[np.uint8]]


def _read(result: SynthResult) -> Scenes:
    images, labels = [], []
    for image_path, label_path in zip(result.image_paths, result.label_paths, strict=True):
        with rasterio.open(image_path) as src:
            images.append(src.read())
        with rasterio.open(label_path) as src:
            labels.append(src.read(1))
    return Scenes(result, images, labels)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Scenes:
    """Three scenes (a 2 x 2 grid with one cell empty), 520 px: not a multiple of 256 or 512."""
    out = tmp_path_factory.mktemp("synth")
    return _read(synthesize_scenes(SynthConfig(out, scenes=3, size_px=520, seed=7)))


def _pixels(scenes: Scenes) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.uint8]]:
    """(4, n) image values and (n,) labels of every pixel with a label."""
    bands = np.concatenate([im.reshape(4, -1) for im in scenes.images], axis=1)
    labels = np.concatenate([lab.ravel() for lab in scenes.labels])
    valid = labels != 15
    return bands[:, valid].astype(np.float64), labels[valid]


def _lookup_accuracy(values: npt.NDArray[np.int64], classes: npt.NDArray[np.int64]) -> float:
    """Accuracy of the best classifier that sees only `values`: each value -> its majority class.

    It beats every threshold rule on the same values, so it bounds them all from above.
    """
    counts = np.bincount(values * 8 + classes, minlength=(int(values.max()) + 1) * 8)
    return float(counts.reshape(-1, 8).max(axis=1).sum() / classes.size)


def test_same_seed_gives_same_bytes_another_seed_other_scenes(tmp_path: Path) -> None:
    first = synthesize_scenes(SynthConfig(tmp_path / "a", scenes=2, size_px=300, seed=3))
    again = synthesize_scenes(SynthConfig(tmp_path / "b", scenes=2, size_px=300, seed=3))
    other = synthesize_scenes(SynthConfig(tmp_path / "c", scenes=2, size_px=300, seed=4))

    written = first.image_paths + first.label_paths
    assert [p.name for p in written] == [p.name for p in again.image_paths + again.label_paths]
    for mine, theirs in zip(written, again.image_paths + again.label_paths, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name
    for labels, other_labels in zip(_read(first).labels, _read(other).labels, strict=True):
        assert (labels != other_labels).mean() > 0.2

    # A rerun into the same folder replaces its own files with identical ones.
    before = [p.read_bytes() for p in written]
    synthesize_scenes(SynthConfig(tmp_path / "a", scenes=2, size_px=300, seed=3))
    assert [p.read_bytes() for p in written] == before
    assert sorted(p.name for p in (tmp_path / "a").rglob("*")) == sorted(
        ["naip", "labels", *(p.name for p in written)]
    )


def test_scenes_are_named_like_naip_and_tile_one_grid(scenes: Scenes) -> None:
    result = scenes.result
    assert [p.parent.name for p in result.image_paths] == ["naip"] * 3
    assert [p.parent.name for p in result.label_paths] == ["labels"] * 3
    assert len({p.name for p in result.image_paths}) == 3
    for image_path, label_path in zip(result.image_paths, result.label_paths, strict=True):
        match = NAME.match(image_path.name)
        assert match, image_path.name
        assert (match[1], match[2]) == ("38", "076")  # Chesapeake Bay, near Annapolis
        assert 1 <= int(match[3]) <= 64
        assert label_path.name == image_path.name.replace(".tif", "_lc.tif")
    assert result.crs == "EPSG:26918"

    bounds = []
    for path in result.image_paths:
        with rasterio.open(path) as src:
            assert src.crs.to_epsg() == 26918
            assert src.res == (1.0, 1.0)
            assert src.shape == (520, 520)
            bounds.append(src.bounds)
    first, second, third = bounds
    assert second.left == first.right and second.top == first.top  # next column
    assert third.top == first.bottom and third.left == first.left  # next row
    union = (
        min(b.left for b in bounds),
        min(b.bottom for b in bounds),
        max(b.right for b in bounds),
        max(b.top for b in bounds),
    )
    assert result.bounds == pytest.approx(union)
    assert union[2] - union[0] == union[3] - union[1] == 1040


def test_images_and_labels_are_tiled_compressed_geotiffs(scenes: Scenes) -> None:
    for image_path, label_path in zip(
        scenes.result.image_paths, scenes.result.label_paths, strict=True
    ):
        with rasterio.open(image_path) as src:
            profile = src.profile
            assert (src.count, src.dtypes) == (4, ("uint8",) * 4)
            assert src.colorinterp == (
                ColorInterp.red,
                ColorInterp.green,
                ColorInterp.blue,
                ColorInterp.undefined,
            )
            assert src.descriptions == ("red", "green", "blue", "nir")
            assert src.nodata == 0
            image_grid = (src.transform, src.shape)
        assert profile["tiled"] and profile["blockxsize"] == profile["blockysize"] == 512
        assert profile["compress"] == "deflate" and profile["interleave"] == "pixel"
        with rasterio.open(label_path) as src:
            profile = src.profile
            assert (src.count, src.dtypes, src.nodata) == (1, ("uint8",), 15)
            assert (src.transform, src.shape) == image_grid
            assert src.colormap(1)[1][:3] == (0, 92, 230)  # water blue
        assert profile["tiled"] and profile["blockxsize"] == 512
        assert profile["compress"] == "deflate"


def test_labels_hold_chesapeake_codes_and_every_class(scenes: Scenes) -> None:
    codes = set()
    for labels in scenes.labels:
        codes |= {int(v) for v in np.unique(labels)}
    assert codes == CHESAPEAKE_CODES
    _, labels = _pixels(scenes)
    shares = np.bincount(labels, minlength=7)[1:] / labels.size
    assert (shares > 0.003).all(), shares
    assert shares[2] > 0.2 and shares[1] > 0.1  # low vegetation and trees dominate, as on land


def test_nodata_marks_image_and_labels_together(scenes: Scenes) -> None:
    for k, (image, labels) in enumerate(zip(scenes.images, scenes.labels, strict=True)):
        zero = image == 0
        assert (zero.any(axis=0) == zero.all(axis=0)).all()  # nodata is all bands or none
        assert (labels[zero[0]] == 15).all()
        if k == len(scenes.images) - 1:
            assert zero[0, -1, -1] and zero[0].mean() > 0.005  # the corner of the flight
        else:
            assert not zero.any()
    first_image, first_labels = scenes.images[0], scenes.labels[0]
    label_only = (first_labels == 15) & (first_image[0] > 0)
    assert label_only[:3].all() and not label_only[10:].any()  # a strip along the top


def test_landscape_is_continuous_across_scene_edges(scenes: Scenes) -> None:
    labels, images = scenes.labels, [im.astype(np.int64) for im in scenes.images]
    east_west = (labels[0][:, -1] == labels[1][:, 0]).mean()
    north_south = (labels[0][-1, :] == labels[2][0, :]).mean()
    far_apart = (labels[0][:, 0] == labels[1][:, 0]).mean()
    assert east_west > 0.85 and north_south > 0.85
    assert far_apart < east_west - 0.2

    within = np.abs(images[0][:, :, -2] - images[0][:, :, -1]).mean()
    across = np.abs(images[0][:, :, -1] - images[1][:, :, 0]).mean()
    assert across < 2 * within
    # ...but each scene has its own gain and offset, like another flight line.
    band_shift = (images[1][:, :, 0] - images[0][:, :, -1]).mean(axis=1)
    assert np.abs(band_shift).max() > 1.0


def test_spectra_are_plausible(scenes: Scenes) -> None:
    bands, labels = _pixels(scenes)
    red, green, blue, nir = bands
    ndvi = (nir - red) / (nir + red)

    def mean(values: npt.NDArray[np.float64], *codes: int) -> float:
        return float(values[np.isin(labels, codes)].mean())

    assert mean(nir, 1) < 60 < mean(nir, 2)  # water is dark in the NIR
    assert mean(ndvi, 2, 3) > mean(ndvi, 5, 6) + 0.2  # vegetation is red-dark, NIR-bright
    visible = (red + green + blue) / 3
    assert mean(visible, 2) < mean(visible, 3) - 10  # tree canopy is darker than fields
    assert abs(mean(red, 5, 6) - mean(blue, 5, 6)) < 10  # impervious surfaces are grey
    assert abs(mean(visible, 4) - mean(visible, 5)) < 25  # barren meets impervious in RGB


def test_no_single_band_threshold_separates_the_classes(scenes: Scenes) -> None:
    bands, labels = _pixels(scenes)
    five = TO_FIVE[labels]
    shares = np.bincount(five, minlength=5)[1:] / five.size
    assert shares.min() > 0.04 and shares.max() < 0.6, shares  # not degenerate

    single_band = [_lookup_accuracy(band.astype(np.int64), five) for band in bands]
    assert max(single_band) < 0.85, single_band

    ndvi = (bands[3] - bands[0]) / (bands[3] + bands[0])
    vegetation = (five == 2) | (five == 3)
    ndvi_bins = np.round((ndvi[vegetation] + 1) * 100).astype(np.int64)
    assert _lookup_accuracy(ndvi_bins, five[vegetation]) < 0.85  # NDVI alone: trees ~ fields

    # All four bands together do carry more: the data is hard, not noise.
    quantized = (bands // 32).astype(np.int64)
    joint = ((quantized[0] * 8 + quantized[1]) * 8 + quantized[2]) * 8 + quantized[3]
    assert _lookup_accuracy(joint, five) > max(single_band) + 0.05


def test_labels_in_another_crs_cover_the_image_footprint(tmp_path: Path) -> None:
    on_grid = _read(synthesize_scenes(SynthConfig(tmp_path / "grid", scenes=2, size_px=300)))
    albers = synthesize_scenes(
        SynthConfig(tmp_path / "albers", scenes=2, size_px=300, label_epsg=5070)
    )
    for k, (image_path, label_path) in enumerate(
        zip(albers.image_paths, albers.label_paths, strict=True)
    ):
        with rasterio.open(image_path) as src:
            assert src.crs.to_epsg() == 26918
            image_crs, image_transform, (height, width) = src.crs, src.transform, src.shape
        rows, cols = np.mgrid[0:height, 0:width]
        xs, ys = xy(image_transform, rows.ravel(), cols.ravel())
        with rasterio.open(label_path) as src:
            assert src.crs.to_epsg() == 5070 and src.res == (1.0, 1.0) and src.nodata == 15
            label_x, label_y = transform_points(image_crs, src.crs, xs, ys)
            label_rows, label_cols = map(np.asarray, rowcol(src.transform, label_x, label_y))
            labels = src.read(1)
        inside = (label_rows >= 0) & (label_rows < labels.shape[0])
        inside &= (label_cols >= 0) & (label_cols < labels.shape[1])
        assert inside.all()  # every image pixel centre falls on the label raster
        sampled = labels[label_rows, label_cols].reshape(height, width)
        expected = on_grid.labels[k]
        assert (sampled == expected).mean() > 0.98  # nearest resampling of the same labels
        assert ((sampled == 15) & (expected != 15)).mean() < 0.002


def test_resolution_060_is_named_and_gridded(tmp_path: Path) -> None:
    result = synthesize_scenes(SynthConfig(tmp_path, scenes=1, size_px=130, resolution_m=0.6))
    (path,) = result.image_paths
    assert "_18_060_" in path.name
    with rasterio.open(path) as src:
        assert src.res == pytest.approx((0.6, 0.6)) and src.shape == (130, 130)
    assert result.bounds[2] - result.bounds[0] == pytest.approx(78.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scenes": 0}, "--scenes 0: need at least 1 scene"),
        ({"size_px": 63}, "--size 63: choose a scene size of 64..16384 pixels"),
        ({"resolution_m": 0.0}, "resolution_m=0.0: NAIP is 0.6 to 2 m"),
        ({"seed": -1}, "--seed -1: the seed must be a non-negative integer"),
        ({"epsg": 4326}, "epsg=4326: NAIP is in UTM; use a northern UTM zone such as 26918"),
        ({"label_epsg": 4326}, "label_epsg=4326: labels need a projected CRS in metres"),
        ({"label_epsg": 999999}, "label_epsg=999999: not a known EPSG code"),
        ({"scenes": 1000, "size_px": 4096}, "keep it under 2500 km2"),
    ],
)
def test_bad_config_is_refused_before_writing(
    tmp_path: Path, change: dict[str, int | float], message: str
) -> None:
    config = SynthConfig(tmp_path / "out", **change)  # type: ignore[arg-type]
    with pytest.raises(TilingError, match=re.escape(message)):
        synthesize_scenes(config)
    assert not (tmp_path / "out").exists()


def test_other_rasters_in_the_output_folder_are_refused(tmp_path: Path) -> None:
    (tmp_path / "naip").mkdir()
    (tmp_path / "naip" / "mine.tif").write_bytes(b"not ours")
    with pytest.raises(TilingError, match=r"holds 1 other \.tif file\(s\) \(e\.g\. mine\.tif\)"):
        synthesize_scenes(SynthConfig(tmp_path, scenes=1, size_px=64))
    assert not (tmp_path / "labels").exists()


def test_smooth_fields_depend_only_on_world_coordinates() -> None:
    # What makes forests and lakes continue across scene edges: a field sampled on two
    # overlapping windows, or at scattered points, gives the same values where they meet.
    x = np.arange(0.5, 900.0, 1.0)
    y = np.arange(0.5, 700.0, 1.0)
    whole = FOREST.on_grid(5, x, y)
    part = FOREST.on_grid(5, x[300:], y[250:])
    np.testing.assert_allclose(part, whole[250:, 300:], atol=1e-5)
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, 700, 50), rng.integers(0, 900, 50)
    np.testing.assert_allclose(FOREST.at(5, x[cols], y[rows]), whole[rows, cols], atol=1e-5)
    assert np.abs(FOREST.on_grid(6, x, y) - whole).mean() > 0.05  # the seed matters
