"""Prediction runs (landcover.prediction.runner): the planned grid, masking, seams, mosaics, COG
output, real NAIP.

The grid itself is in test_outgrid.py, blending in test_blend.py, bad input and interrupted
runs in test_failures.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
import shapely
from affine import Affine
from click.testing import CliRunner
from rasterio.crs import CRS
from rasterio.enums import ColorInterp
from rio_cogeo.cogeo import cog_validate

from landcover import cli
from landcover.errors import RegionError
from landcover.prediction import intofile, runner
from landcover.prediction.config import PredictConfig
from landcover.prediction.gridwindow import Window
from landcover.prediction.mosaic import read_mosaic
from landcover.prediction.outfiles import PROBABILITY_NODATA, to_cog
from landcover.prediction.outgrid import TAG_CLASS_MAP, TAG_CLASS_NAMES, plan_output_grid
from landcover.prediction.region import Region
from landcover.prediction.runner import predict_region
from landcover.prediction.setup import (
    GDAL_CACHE_BYTES,
    FreedMemory,
    block_cache_bytes,
    open_images,
)
from tests.landcover.prediction.inputs import (
    CLASS_MAP,
    ORIGIN,
    UTM18,
    pixels,
    read,
    utm_region,
    write_image,
    write_model,
)
from tiling.sources.reader import RasterReader


def test_predicted_raster_has_the_planned_grid(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    region = utm_region(500_010.6, 3_999_930.2, 500_050.7, 3_999_990.0)
    result = predict_region(
        PredictConfig(str(constant_model), (str(scene),), str(out), region=region, device="cpu")
    )
    data, profile = read(out)
    assert profile["crs"] == CRS.from_user_input(UTM18)
    assert profile["transform"] == Affine(1.0, 0.0, 500_010.0, 0.0, -1.0, 3_999_990.0)
    assert (profile["width"], profile["height"]) == (41, 60)
    assert profile["nodata"] == 0
    # The first column's centres (x = 500010.5) fall outside the region; all others inside.
    assert (data[0, :, 0] == 0).all() and (data[0, :, 1:] == 3).all()
    assert result.valid_pixels == 40 * 60


# -- constant model, masking ---------------------------------------------------------------------


def test_constant_model_gives_a_constant_map_without_seams(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    out, prob = tmp_path / "lc.tif", tmp_path / "p.tif"
    predict_region(
        PredictConfig(
            str(constant_model),
            (str(scene),),
            str(out),
            probabilities=str(prob),
            block_px=64,  # several blocks, windows straddling them
            overlap_px=8,
            batch_size=3,
            device="cpu",
        )
    )
    data, _ = read(out)
    assert data.shape == (1, 75, 90)
    assert (data == 3).all()
    probs, prob_profile = read(prob)
    assert probs.shape == (4, 75, 90)
    for band in range(4):
        assert len(np.unique(probs[band])) == 1  # constant: no window-edge effects
    assert probs[2, 0, 0] > probs[0, 0, 0]
    assert prob_profile["nodata"] == PROBABILITY_NODATA


def test_polygon_masking_follows_pixel_centres(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    triangle = shapely.Polygon(
        [(500_003.0, 3_999_990.0), (500_085.0, 3_999_930.0), (500_010.0, 3_999_928.0)]
    )
    path = tmp_path / "tri.geojson"
    path.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "crs": {"type": "name", "properties": {"name": "EPSG:32618"}},
                "features": [
                    {
                        "type": "Feature",
                        "properties": {},
                        "geometry": shapely.geometry.mapping(triangle),
                    }
                ],
            }
        )
    )
    out = tmp_path / "lc.tif"
    result = CliRunner().invoke(
        cli.main,
        [
            "predict",
            str(constant_model),
            str(scene),
            "--out",
            str(out),
            "--region",
            str(path),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    with rasterio.open(out) as ds:
        data = ds.read(1)
        t = ds.transform
    rows, cols = np.mgrid[0 : data.shape[0], 0 : data.shape[1]]
    xs, ys = t @ (cols + 0.5, rows + 0.5)
    inside = shapely.contains_xy(triangle, xs, ys)
    assert inside.sum() > 100 and (~inside).sum() > 100
    np.testing.assert_array_equal(data, np.where(inside, 3, 0))


def collar_image(path: Path, *, nodata: float | None) -> tuple[Path, npt.NDArray[np.bool_]]:
    """70 x 90 px with a slanted black collar (0 in all four bands) down the left edge, as
    around a reprojected NAIP tile; returns the path and the collar mask."""
    data = pixels(70, 90, seed=11)
    rows, cols = np.mgrid[0:70, 0:90]
    collar = cols < 12 + rows // 4
    data[:, collar] = 0
    return write_image(path, data, nodata=nodata), collar


def test_black_collar_of_an_image_without_nodata_is_nodata(
    random_model: Path, tmp_path: Path
) -> None:
    # Runs once the tiling change (zero_is_nodata in tiling.sources.rasters) is merged.
    bare, collar = collar_image(tmp_path / "bare.tif", nodata=None)
    declared, _ = collar_image(tmp_path / "declared.tif", nodata=0)
    maps = {}
    for image in (bare, declared):
        out = tmp_path / f"lc-{image.stem}.tif"
        result = CliRunner().invoke(
            cli.main,
            ["predict", str(random_model), str(image), "--out", str(out), "--device", "cpu"],
        )
        assert result.exit_code == 0, result.output
        maps[image.stem] = read(out)[0][0]
    assert (maps["bare"][collar] == 0).all()
    assert (maps["bare"][~collar] > 0).all()
    assert len(np.unique(maps["bare"][~collar])) > 1  # a model that sees the pixels
    # The collar does not bleed into its neighbours: they are predicted as next to nodata
    # (the band mean), exactly as when the file declares nodata 0.
    np.testing.assert_array_equal(maps["bare"], maps["declared"])


def test_no_zero_nodata_keeps_black_pixels_as_data(random_model: Path, tmp_path: Path) -> None:
    # Runs once the tiling change (zero_is_nodata in tiling.sources.rasters) is merged.
    bare, _ = collar_image(tmp_path / "bare.tif", nodata=None)
    out = tmp_path / "lc.tif"
    result = CliRunner().invoke(
        cli.main,
        [
            "predict",
            str(random_model),
            str(bare),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--no-zero-nodata",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "90 x 70 px" in result.output and f"{70 * 90:,} px predicted" in result.output
    assert (read(out)[0][0] > 0).all()


# -- mosaics -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_adjacent_scenes_predict_like_their_mosaic(random_model: Path, tmp_path: Path) -> None:
    full = pixels(70, 130, seed=3)
    mosaic = write_image(tmp_path / "mosaic.tif", full)
    left = write_image(tmp_path / "left.tif", full[:, :, :61])
    right = write_image(
        tmp_path / "right.tif",
        full[:, :, 61:],
        transform=Affine(1.0, 0.0, ORIGIN[0] + 61, 0.0, -1.0, ORIGIN[1]),
    )
    region = utm_region(500_004.5, 3_999_935.5, 500_125.5, 3_999_997.0)
    outputs = []
    for name, images in [("split", (str(left), str(right))), ("whole", (str(mosaic),))]:
        out, prob = tmp_path / f"{name}.tif", tmp_path / f"{name}-p.tif"
        result = predict_region(
            PredictConfig(
                str(random_model),
                images,
                str(out),
                region=region,
                probabilities=str(prob),
                block_px=48,
                device="cpu",
            )
        )
        outputs.append((read(out), read(prob), result))
    (split, split_profile), (split_p, _), split_result = outputs[0]
    (whole, whole_profile), (whole_p, _), _ = outputs[1]
    assert split_profile["transform"] == whole_profile["transform"]
    assert len(np.unique(split[split > 0])) > 1  # a model that sees the pixels, not a constant
    np.testing.assert_array_equal(split, whole)
    np.testing.assert_array_equal(split_p, whole_p)
    assert len(split_result.sources) == 2


def test_scenes_in_two_utm_zones_are_warped_onto_one_grid(
    constant_model: Path, tmp_path: Path
) -> None:
    # Two scenes either side of the 18N / 17N boundary (75 W), each in its own zone.
    east = write_image(
        tmp_path / "east.tif",
        pixels(60, 60, seed=4),
        crs="EPSG:32618",
        transform=Affine(1.0, 0.0, 229_500.0, 0.0, -1.0, 4_000_030.0),
    )
    west = write_image(
        tmp_path / "west.tif",
        pixels(60, 60, seed=5),
        crs="EPSG:32617",
        transform=Affine(1.0, 0.0, 770_440.0, 0.0, -1.0, 4_000_030.0),
    )
    sources = open_images([str(east), str(west)])
    plan = plan_output_grid(sources, None, resolution_m=1.0)
    assert plan.grid.crs == CRS.from_user_input("EPSG:32618")  # the first image's
    out = tmp_path / "lc.tif"
    result = predict_region(
        PredictConfig(str(constant_model), (str(east), str(west)), str(out), device="cpu")
    )
    assert len(result.sources) == 2
    data, _ = read(out)
    assert result.valid_pixels > 60 * 60 * 1.5  # both scenes contribute
    assert set(np.unique(data)) == {0, 3}


# -- COG -----------------------------------------------------------------------------------------


def test_output_is_a_valid_cog_with_colormap_and_class_names(
    scene: Path, constant_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    predict_region(PredictConfig(str(constant_model), (str(scene),), str(out), device="cpu"))
    valid, errors, _ = cog_validate(str(out))
    assert valid, errors
    with rasterio.open(out) as ds:
        assert ds.colormap(1)[1] == (*CLASS_MAP.classes[1].color, 255)
        assert json.loads(ds.tags()[TAG_CLASS_NAMES]) == CLASS_MAP.class_names
        assert json.loads(ds.tags()[TAG_CLASS_MAP])["name"] == "chesapeake7to5"
        assert ds.profile["tiled"] and ds.compression is not None
    assert [p.name for p in tmp_path.iterdir()] == ["lc.tif"]  # no temp files left


def test_cog_conversion_builds_mode_overviews(tmp_path: Path) -> None:
    # Big enough for overviews (the tests' predictions are smaller than one 512 px tile).
    rng = np.random.default_rng(0)
    classes = np.repeat(np.repeat(rng.integers(1, 5, size=(33, 41)), 32, 0), 32, 1).astype(np.uint8)
    src = tmp_path / "tiles.tif"
    with rasterio.open(
        src,
        "w",
        driver="GTiff",
        width=classes.shape[1],
        height=classes.shape[0],
        count=1,
        dtype="uint8",
        crs=UTM18,
        transform=Affine(1, 0, ORIGIN[0], 0, -1, ORIGIN[1]),
        nodata=0,
        tiled=True,
        blockxsize=512,
        blockysize=512,
    ) as dst:
        dst.write(classes, 1)
        dst.write_colormap(1, {1: (255, 0, 0, 255), 2: (0, 255, 0, 255)})
    cog = tmp_path / "cog.tif"
    to_cog(str(src), str(cog), resampling="MODE")
    assert cog_validate(str(cog))[0]
    with rasterio.open(cog) as ds:
        assert ds.overviews(1) == [2, 4]
        overview = ds.read(1, out_shape=(classes.shape[0] // 4, classes.shape[1] // 4))
        assert ds.colormap(1)[1] == (255, 0, 0, 255)
    assert set(np.unique(overview)) <= {1, 2, 3, 4}  # classes, never averages of codes
    np.testing.assert_array_equal(overview, classes[::4, ::4])


# -- real NAIP -----------------------------------------------------------------------------------


def test_real_naip_with_nir_tagged_as_alpha(real_naip_dir: Path, tmp_path: Path) -> None:
    image = real_naip_dir / "m_4208701_ne_16_060_20200902.tif"
    with rasterio.open(image) as ds:
        assert ds.colorinterp[3] == ColorInterp.alpha  # the quirk this test is about
        source = ds.read()
        profile = ds.profile
    # The same pixels with the 4th band tagged as plain data.
    plain = tmp_path / "plain.tif"
    profile.update(photometric="minisblack", alpha="unspecified")
    with rasterio.open(plain, "w", **profile) as dst:
        dst.write(source)
        dst.colorinterp = [
            ColorInterp.red,
            ColorInterp.green,
            ColorInterp.blue,
            ColorInterp.undefined,
        ]
    model = write_model(tmp_path / "m.pt", constant_class=2, resolution_m=0.6)
    out = tmp_path / "lc.tif"
    result = predict_region(PredictConfig(str(model), (str(image),), str(out), device="cpu"))
    grid = result.grid
    left, bottom, right, top = rasterio.open(image).bounds
    # Not the image's grid (0.5994 x 0.6008 m pixels): multiples of the model's 0.6 m.
    assert grid.crs.to_epsg() == 26916
    assert grid.transform == Affine(
        0.6,
        0.0,
        round(np.floor(left / 0.6) * 0.6, 7),
        0.0,
        -0.6,
        round(np.ceil(top / 0.6) * 0.6, 7),
    )
    assert grid.width == int(np.ceil(right / 0.6) - np.floor(left / 0.6))
    assert grid.height == int(np.ceil(top / 0.6) - np.floor(bottom / 0.6))
    data, _ = read(out)
    # Every pixel whose centre lies on the image is predicted: NIR never masks anything.
    rows, cols = np.mgrid[0 : grid.height, 0 : grid.width]
    xs, ys = grid.transform @ (cols + 0.5, rows + 0.5)
    on_image = (xs > left) & (xs < right) & (ys > bottom) & (ys < top)
    np.testing.assert_array_equal(data[0], np.where(on_image, 2, 0))
    assert cog_validate(str(out))[0]
    # What the model sees: warped NIR identical to the NIR of the untagged copy, and present.
    reader = RasterReader()
    for path in (image, plain):
        plan = plan_output_grid(open_images([str(path)]), None, resolution_m=0.6)
        values, valid = read_mosaic(plan, reader, grid.window)
        if path == image:
            tagged, tagged_valid = values, valid
    reader.close()
    np.testing.assert_array_equal(tagged, values)
    np.testing.assert_array_equal(tagged_valid, valid)
    assert tagged[3][tagged_valid].mean() > 100  # NIR of vegetation, not an all-255 alpha


def test_nir_alpha_band_with_zeros_is_data_not_a_mask(constant_model: Path, tmp_path: Path) -> None:
    data = pixels(50, 70, seed=6)
    data[3, 10:30, 20:50] = 0  # an alpha reading would make these pixels transparent
    image = write_image(tmp_path / "a.tif", data, nir_as_alpha=True)
    out = tmp_path / "lc.tif"
    result = predict_region(
        PredictConfig(str(constant_model), (str(image),), str(out), device="cpu")
    )
    assert result.valid_pixels == 50 * 70
    plan = plan_output_grid(open_images([str(image)]), None, resolution_m=1.0)
    reader = RasterReader()
    values, valid = read_mosaic(plan, reader, Window(0, 0, 50, 70))
    reader.close()
    assert valid.all()
    np.testing.assert_array_equal(values, data)


def test_real_naip_at_coarse_resolution_with_nodata_and_a_bbox(
    real_naip_paths: list[Path], tmp_path: Path
) -> None:
    model = write_model(tmp_path / "m.pt", constant_class=1, resolution_m=30.0)
    out = tmp_path / "lc.tif"
    images = [str(p) for p in real_naip_paths]
    nodata_image = next(p for p in real_naip_paths if "m_3610332" in p.name)
    with rasterio.open(nodata_image) as ds:
        west, south, east, north = rasterio.warp.transform_bounds(ds.crs, "EPSG:4326", *ds.bounds)
    bbox = f"{west + 0.01},{south + 0.01},{east - 0.01},{north - 0.01}"
    result = CliRunner().invoke(
        cli.main,
        ["predict", str(model), *images, "--out", str(out), "--bbox", bbox, "--device", "cpu"],
    )
    assert result.exit_code == 0, result.output
    with rasterio.open(out) as ds:
        assert ds.crs.to_epsg() == 26913  # the CRS of the one image under the box
        assert ds.res == (30.0, 30.0)
        assert set(np.unique(ds.read(1))) == {0, 1}


def test_real_naip_scattered_over_the_country_needs_a_region(
    real_naip_paths: list[Path], tmp_path: Path
) -> None:
    model = write_model(tmp_path / "m.pt", constant_class=1, resolution_m=30.0)
    with pytest.raises(RegionError, match=r"the 6 images are far apart.*give --region"):
        predict_region(
            PredictConfig(str(model), tuple(map(str, real_naip_paths)), str(tmp_path / "o.tif"))
        )


@pytest.mark.slow
def test_output_does_not_depend_on_the_block_size(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    # Blocks of 40 px cut through windows in both directions (the logits of windows that reach
    # into later blocks are kept for them); one 2048 px block holds everything.
    results = []
    for block_px in (40, 2048):
        out, prob = tmp_path / f"{block_px}.tif", tmp_path / f"{block_px}-p.tif"
        result = predict_region(
            PredictConfig(
                str(random_model),
                (str(scene),),
                str(out),
                probabilities=str(prob),
                block_px=block_px,
                device="cpu",
            )
        )
        results.append((read(out)[0], read(prob)[0], result.windows))
    (small, small_p, small_runs), (big, big_p, big_runs) = results
    assert len(np.unique(big)) > 1
    np.testing.assert_array_equal(small, big)
    assert np.abs(small_p.astype(int) - big_p.astype(int)).max() <= 1  # float sum order
    assert big_runs == 3 * 4  # windows of 32 px, overlap 8, over 75 x 90 px
    assert small_runs == big_runs  # each window once, however the blocks cut it


def test_the_class_map_is_the_same_with_or_without_the_probabilities(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    """Classes are the argmax of the blocks' weighted sums, divided into means only for the
    probabilities: asking for them changes no class."""
    maps = []
    for probabilities in (None, str(tmp_path / "p.tif")):
        out = tmp_path / f"lc-{probabilities is None}.tif"
        predict_region(
            PredictConfig(
                str(random_model),
                (str(scene),),
                str(out),
                probabilities=probabilities,
                block_px=40,
                device="cpu",
            )
        )
        maps.append(read(out)[0])
    assert len(np.unique(maps[0])) > 1
    np.testing.assert_array_equal(maps[0], maps[1])


def test_pipelined_run_writes_the_same_bytes_as_one_thread(
    random_model: Path, tmp_path: Path
) -> None:
    # 20 blocks of 32 px under a triangle: blocks cut through windows both ways (carried
    # logits, windows run again for the next block row), corner blocks lie outside the region
    # (never written) and edge blocks are cut short.
    image = write_image(tmp_path / "big.tif", pixels(130, 170, seed=3))
    triangle = shapely.Polygon(
        [(500_002.0, 3_999_999.0), (500_168.0, 3_999_990.0), (500_020.0, 3_999_872.0)]
    )
    region = Region(triangle, CRS.from_user_input(UTM18))
    outputs, results = [], []
    for pipeline in (False, True):
        folder = tmp_path / ("pipelined" if pipeline else "one-thread")
        result = predict_region(
            PredictConfig(
                str(random_model),
                (str(image),),
                str(folder / "lc.tif"),
                region=region,
                probabilities=str(folder / "p.tif"),
                block_px=32,
                batch_size=3,
                device="cpu",
                pipeline=pipeline,
            )
        )
        outputs.append(((folder / "lc.tif").read_bytes(), (folder / "p.tif").read_bytes()))
        results.append((result.windows, result.valid_pixels, result.class_pixels))
    assert outputs[0] == outputs[1]
    assert results[0] == results[1]
    classes = read(tmp_path / "pipelined" / "lc.tif")[0]
    assert len(np.unique(classes)) > 2 and (classes == 0).sum() > 1000


def test_blocks_run_under_a_gdal_cache_sized_to_them(
    random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GDAL's cache is process-wide; the Env that sets it is the calling thread's, which runs
    # the model (and releases freed memory after each block) and then writes the COGs.
    seen: dict[str, list[object]] = {"blocks": [], "cogs": []}
    release = FreedMemory.release
    write_cogs = runner.write_cogs

    def recording_release(self: FreedMemory) -> None:
        seen["blocks"].append(rasterio.env.getenv().get("GDAL_CACHEMAX"))
        release(self)

    def recording_write_cogs(*args: Any) -> None:
        seen["cogs"].append(rasterio.env.getenv().get("GDAL_CACHEMAX"))
        write_cogs(*args)

    monkeypatch.setattr(FreedMemory, "release", recording_release)
    monkeypatch.setattr(runner, "write_cogs", recording_write_cogs)
    image = write_image(tmp_path / "in.tif", pixels(130, 170, seed=3))
    predict_region(
        PredictConfig(
            str(random_model),
            (str(image),),
            str(tmp_path / "lc.tif"),
            probabilities=str(tmp_path / "p.tif"),
            block_px=32,
            device="cpu",
        )
    )
    expected = block_cache_bytes(32, 170, out_bands=CLASS_MAP.num_classes, in_bands=4)
    assert len(seen["blocks"]) > 1 and set(seen["blocks"]) == {expected}
    assert seen["cogs"] == [GDAL_CACHE_BYTES] != [expected]


def test_blocks_are_read_and_written_with_one_gdal_thread_and_the_cogs_with_all(
    random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader and writer threads share the cores with the model's: GDAL must not start
    # threads of its own there. The COG conversion, alone at the end, uses every core.
    seen: dict[str, list[object]] = {"read": [], "write": [], "cogs": []}
    prepare_block = intofile.prepare_block
    write_cogs = runner.write_cogs

    def recording_prepare(*args: Any) -> Any:
        seen["read"].append(rasterio.env.get_gdal_config("GDAL_NUM_THREADS"))
        return prepare_block(*args)

    class RecordingWriter(intofile.BlockWriter):
        def __call__(self, predicted: Any) -> None:
            seen["write"].append(rasterio.env.get_gdal_config("GDAL_NUM_THREADS"))
            super().__call__(predicted)

    def recording_write_cogs(*args: Any) -> None:
        seen["cogs"].append(rasterio.env.get_gdal_config("GDAL_NUM_THREADS"))
        write_cogs(*args)

    monkeypatch.setattr(intofile, "prepare_block", recording_prepare)
    monkeypatch.setattr(intofile, "BlockWriter", RecordingWriter)
    monkeypatch.setattr(runner, "write_cogs", recording_write_cogs)
    image = write_image(tmp_path / "in.tif", pixels(130, 170, seed=3))
    predict_region(
        PredictConfig(
            str(random_model), (str(image),), str(tmp_path / "lc.tif"), block_px=32, device="cpu"
        )
    )
    one = {intofile.PIPELINE_GDAL_THREADS}  # rasterio reads "1" back as 1
    assert len(seen["read"]) > 1 and {str(v) for v in seen["read"]} == one
    assert len(seen["write"]) > 1 and {str(v) for v in seen["write"]} == one
    assert seen["cogs"] == ["ALL_CPUS"]


def test_probability_bands_are_named_by_class_and_carry_no_colour(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    """Four uint8 bands are red, green, blue and alpha to GDAL unless told otherwise: a viewer
    would show the probabilities as a colour image, the 4th class as transparency. A GeoTIFF
    reads its first band of such a raster as gray, the others as undefined."""
    out, prob = tmp_path / "lc.tif", tmp_path / "p.tif"
    config = PredictConfig(
        str(random_model), (str(scene),), str(out), probabilities=str(prob), device="cpu"
    )
    predict_region(config)
    with rasterio.open(prob) as ds:
        assert ds.count == 4
        assert ds.colorinterp == (ColorInterp.gray, *[ColorInterp.undefined] * 3)
        assert ds.descriptions == tuple(CLASS_MAP.class_names[1:])
        assert ds.scales == (1 / 254,) * 4
    assert cog_validate(str(prob))[0]
    with rasterio.open(out) as ds:
        assert ds.colorinterp == (ColorInterp.palette,)
