"""The output grid of a prediction (landcover.prediction.outgrid): pixel-aligned to the source,
from a region in another CRS, and at another resolution."""

from __future__ import annotations

from pathlib import Path

import pyproj
from affine import Affine
from rasterio.crs import CRS

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
