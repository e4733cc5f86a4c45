"""The output grid of a prediction (landcover.prediction.outgrid): pixel-aligned to the source,
from a region in another CRS, and at another resolution."""

from __future__ import annotations

import logging
from pathlib import Path

import pyproj
import pytest
from affine import Affine
from rasterio.crs import CRS

from landcover.errors import PredictionError
from landcover.prediction.outgrid import plan_output_grid
from landcover.prediction.region import parse_bbox
from landcover.prediction.setup import open_images
from tests.landcover.prediction.inputs import UTM18, pixels, utm_region, write_image


def test_grid_for_a_region_is_pixel_aligned_to_the_source(scene: Path) -> None:
    sources = open_images([str(scene)])
    plan = plan_output_grid(
        sources, utm_region(500_010.6, 3_999_930.2, 500_050.7, 3_999_990.0), resolution_m=1.0
    )
    grid = plan.grid
    assert grid.crs == CRS.from_user_input(UTM18)
    assert grid.transform == Affine(1.0, 0.0, 500_010.0, 0.0, -1.0, 3_999_990.0)
    assert (grid.width, grid.height) == (41, 60)


def test_grid_of_a_region_in_degrees_is_aligned_to_the_source_grid(tmp_path: Path) -> None:
    # A source whose origin is not a multiple of its pixel size.
    transform = Affine(1.0, 0.0, 500_000.25, 0.0, -1.0, 4_000_000.75)
    image = write_image(tmp_path / "a.tif", pixels(75, 90, seed=2), transform=transform)
    to_lonlat = pyproj.Transformer.from_crs(UTM18, "EPSG:4326", always_xy=True)
    west, south = to_lonlat.transform(500_011.0, 3_999_941.0)
    east, north = to_lonlat.transform(500_063.0, 3_999_987.0)
    region = parse_bbox(f"{west},{south},{east},{north}")  # lon/lat inside the image
    plan = plan_output_grid(open_images([str(image)]), region, resolution_m=1.0)
    t = plan.grid.transform
    assert (t.a, t.e) == (1.0, -1.0)
    assert (t.c - 500_000.25) % 1.0 == 0 and (4_000_000.75 - t.f) % 1.0 == 0
    outline = region.to_crs(plan.grid.crs).geometry
    left, bottom, right, top = plan.grid.bounds
    minx, miny, maxx, maxy = outline.bounds
    assert left <= minx < left + 1 and right - 1 < maxx <= right
    assert bottom <= miny < bottom + 1 and top - 1 < maxy <= top


def test_grid_at_another_resolution_snaps_to_multiples_of_the_pixel(scene: Path) -> None:
    plan = plan_output_grid(open_images([str(scene)]), None, resolution_m=2.0)
    assert plan.grid.transform == Affine(2.0, 0.0, 500_000.0, 0.0, -2.0, 4_000_000.0)
    assert (plan.grid.width, plan.grid.height) == (45, 38)  # 90/2, ceil(75/2)


@pytest.mark.parametrize(
    ("resolution", "said"),
    [
        (300.0, "--resolution 300 (300 m) is 300x coarser"),
        (4.5, "--resolution 4.5 (4.5 m) is 4.5x coarser"),
        (0.2, "--resolution 0.2 (0.2 m) is 5x finer"),
    ],
)
def test_a_resolution_more_than_4x_off_the_models_is_refused(
    scene: Path, resolution: float, said: str
) -> None:
    with pytest.raises(PredictionError) as caught:
        plan_output_grid(open_images([str(scene)]), None, resolution_m=1.0, resolution=resolution)
    assert str(caught.value) == (
        f"{said} than the 1 m the model was trained at (more than 4x is refused); give a "
        "--resolution between 0.25 and 4 m, or none for the model's own (for a coarser map, "
        "read the COG's overviews)"
    )


@pytest.mark.parametrize(("resolution", "warned"), [(4.0, True), (0.6, True), (1.5, False)])
def test_a_resolution_more_than_1_5x_off_the_models_is_warned_about(
    scene: Path, resolution: float, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    images = open_images([str(scene)])
    with caplog.at_level(logging.WARNING, logger="landcover.prediction.outgrid"):
        plan = plan_output_grid(images, None, resolution_m=1.0, resolution=resolution)
        plan_output_grid(images, None, resolution_m=1.0, resolution=resolution, quiet=True)
    assert plan.grid.resolution == resolution
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == warned  # once: a quiet plan (a job's other ranks) says nothing
    if warned:
        assert lines[0].startswith(f"--resolution {resolution:g} ({resolution:g} m) is ")
        assert "expect a less accurate map (more than 4x off is refused)" in lines[0]


def test_a_model_of_unknown_resolution_takes_any(scene: Path) -> None:
    plan = plan_output_grid(open_images([str(scene)]), None, resolution_m=0.0, resolution=30.0)
    assert plan.grid.resolution == 30.0


def test_thousands_of_sources_are_found_under_a_window_as_a_scan_finds_them() -> None:
    """2,000 small sources (a state's count; no files: their descriptions alone), some in
    another CRS: the spatial index gives, for windows anywhere on the grid, exactly the
    sources whose footprint a scan of every footprint finds, in the plan's order."""
    import numpy as np
    import shapely

    from tiling.sources.rasters import RasterInfo

    utm, albers = CRS.from_epsg(26918), CRS.from_epsg(5070)
    sources = [
        RasterInfo(
            path=f"s{k}.tif", crs=utm if k % 7 else albers,
            transform=Affine(1, 0, 370_000 + 200 * (k % 60), 0, -1, 4_300_000 - 200 * (k // 60))
            if k % 7 else Affine(1, 0, 1_625_000 + 3 * k, 0, -1, 1_960_000 - 2 * k),
            height=256, width=256, count=4, dtype="uint8", nodata=None, block_shape=(256, 256),
            mask_kind="none",
        )
        for k in range(2000)
    ]  # fmt: skip
    plan = plan_output_grid(sources, None, resolution_m=1.0, max_pixels=None)
    assert plan.footprint_index is not None and len(plan.sources) == 2000
    rng = np.random.default_rng(0)
    for _ in range(50):
        row, col = rng.integers(0, plan.grid.height), rng.integers(0, plan.grid.width)
        size = int(rng.integers(1, 700))
        window = shapely.box(*plan.grid.window_bounds(int(row), int(col), size, size))
        scan = [i for i, f in enumerate(plan.footprints) if f.intersects(window)]
        assert plan.sources_touching(window) == scan
