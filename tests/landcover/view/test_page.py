"""`landcover view`: the page in headless Chromium (legend, class colours, opacity, no console
errors, no request leaving the page), the pictures it embeds against the map's pixels, exact
class areas, a tiled product's mosaic, bad input, and --serve."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
from click.testing import CliRunner, Result
from PIL import Image
from pyproj import Geod

from landcover.cli.app import main
from landcover.view import ViewConfig, build_page, class_areas, class_rgba, open_map
from landcover.view import page as page_module
from tests.browser import render
from tests.landcover.view.maps import (
    FIVE,
    RES_M,
    X0,
    class_blocks,
    geodesic_areas,
    write_map,
    write_mosaic,
    write_scene,
)

HEIGHT, WIDTH = 160, 240


@pytest.fixture(scope="module")
def mapped(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, npt.NDArray[np.uint8]]:
    """A 240 x 160 px map at 2 m recording the 1 m image beneath it, and its codes."""
    folder = tmp_path_factory.mktemp("view")
    codes = class_blocks(HEIGHT, WIDTH, seed=5)
    scene = write_scene(folder / "scene.tif", HEIGHT * RES_M, WIDTH * RES_M)
    return write_map(folder / "lc.tif", codes, sources=[str(scene)]), scene, codes


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["view", *args])


def embedded(html: str) -> dict[str, Any]:
    found = re.search(r'<script id="view-data" type="application/json">(.*?)</script>', html)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def picture(uri: str) -> npt.NDArray[np.uint8]:
    head, _, body = uri.partition(",")
    assert head.startswith("data:image/")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(body))).convert("RGBA"))


def test_the_page_in_chromium_shows_legend_colours_and_opacity_without_errors(
    chromium: Path,
    mapped: tuple[Path, Path, npt.NDArray[np.uint8]],
    tmp_path: Path,
) -> None:
    lc, _, codes = mapped
    page = tmp_path / "page.html"
    result = CliRunner().invoke(main, ["view", str(lc), "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {page}: 1 map(s), 1 image(s) beneath")
    opaque = (
        "(function () { const s = document.getElementById('opacity'); s.value = '100';"
        " s.dispatchEvent(new Event('input')); return true; })()"
    )
    shown = render(
        chromium,
        page,
        scripts=[opaque],
        values={
            "rows": "Array.from(document.querySelectorAll('#legend tbody tr')).map(r =>"
            " [Number(r.dataset.code), Number(r.dataset.pixels), Number(r.dataset.km2),"
            " r.querySelector('.name').textContent])",
            "legend": "document.getElementById('legend').innerText",
            "opacities": "Array.from(document.querySelectorAll('img.classes'))"
            ".map(i => i.style.opacity)",
            "layers": "document.querySelector('.leaflet-control-layers').innerText",
        },
    )
    assert shown.errors == []
    assert all(u.startswith(("file:", "data:")) for u in shown.requests), shown.requests
    counts = np.bincount(codes.ravel(), minlength=FIVE.num_classes)
    on_ellipsoid = geodesic_areas(lc, codes)
    expected = [
        [c.code, int(counts[c.code]), on_ellipsoid[c.code] / 1e6, c.name] for c in FIVE.classes[1:]
    ]
    assert [row[:2] + row[3:] for row in shown.values["rows"]] == [
        row[:2] + row[3:] for row in expected
    ]
    for row, want in zip(shown.values["rows"], expected, strict=True):
        assert row[2] == pytest.approx(want[2], rel=1e-5)
    for name in FIVE.class_names[1:]:
        assert name in shown.values["legend"]
    assert "imagery" in shown.values["layers"] and "lc.tif" in shown.values["layers"]
    assert shown.values["opacities"] and set(shown.values["opacities"]) == {"1"}
    for c in FIVE.classes[1:]:
        assert shown.has_colour(c.color), f"{c.name} {c.color} is not on the screenshot"


def test_the_finest_pictures_are_the_maps_pixels_and_the_areas_every_pixel(
    mapped: tuple[Path, Path, npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    lc, scene, codes = mapped
    monkeypatch.setattr(page_module, "CHUNK_PX", 100)  # several pieces per level
    page = build_page(ViewConfig(maps=(open_map(str(lc)),)))
    assert page.images == (str(scene),)
    assert page.levels == ((WIDTH, HEIGHT),)  # no level finer than the map
    (level,) = embedded(page.html)["levels"]
    stitched = np.zeros((HEIGHT, WIDTH, 4), dtype=np.uint8)
    for piece in level["pieces"]:
        (south, west), (north, east) = piece["bounds"]
        rows, cols = slice(round(-north), round(-south)), slice(round(west), round(east))
        stitched[rows, cols] = picture(piece["classes"][0])
        assert picture(piece["imagery"])[..., 3].all()  # the image covers the map
    assert len(level["pieces"]) == 6
    np.testing.assert_array_equal(stitched, class_rgba(codes, FIVE))
    counts = np.bincount(codes.ravel(), minlength=FIVE.num_classes)
    assert [a.pixels for a in page.areas[0]] == counts[1:].tolist()
    assert sum(a.share for a in page.areas[0]) == pytest.approx(1.0)


def test_a_large_map_is_drawn_from_a_bounded_pyramid_with_exact_areas(tmp_path: Path) -> None:
    codes = class_blocks(400, 1000, seed=9)
    lc = write_map(tmp_path / "big.tif", codes)
    with rasterio.open(lc) as ds:
        assert ds.overviews(1)  # the reads below can use them
    page = build_page(ViewConfig(maps=(open_map(str(lc)),), detail_px=512))
    assert [max(size) for size in page.levels] == [256, 512]
    colours = {(*c.color, 255) for c in FIVE.classes[1:]} | {(0, 0, 0, 0)}
    for level, (width, height) in zip(embedded(page.html)["levels"], page.levels, strict=True):
        assert (level["width"], level["height"]) == (width, height)
        for piece in level["pieces"]:
            pixels = picture(piece["classes"][0])
            assert max(pixels.shape[:2]) <= 512
            assert {tuple(p) for p in pixels.reshape(-1, 4)} <= colours
    assert page.images == ()  # none recorded: the classes alone
    assert "no imagery recorded in the map" in page.html
    counts = np.bincount(codes.ravel(), minlength=FIVE.num_classes)
    assert [a.pixels for a in page.areas[0]] == counts[1:].tolist()


def test_a_tiled_product_opens_as_its_mosaic_with_every_tiles_images(tmp_path: Path) -> None:
    left, right = class_blocks(256, 256, seed=1), class_blocks(256, 256, seed=2)
    tiles = [
        write_map(tmp_path / "tile_0_0.tif", left, sources=["/data/a.tif"]),
        write_map(tmp_path / "tile_0_1.tif", right, sources=["/data/b.tif"], x0=X0 + 256 * RES_M),
    ]
    write_mosaic(tmp_path, tiles, 256, 256)
    mosaic = open_map(str(tmp_path))
    assert Path(mosaic.path).name == "mosaic.vrt" and mosaic.name == tmp_path.name
    assert (mosaic.width, mosaic.height) == (512, 256)
    assert mosaic.sources == ("/data/a.tif", "/data/b.tif")
    assert mosaic.class_map.class_names == FIVE.class_names
    assert mosaic.parts == tuple(str(t) for t in tiles)  # pictures read the tiles' overviews
    both = np.concatenate([left, right], axis=1)
    counts = np.bincount(both.ravel(), minlength=FIVE.num_classes)
    assert [a.pixels for a in class_areas(mosaic)] == counts[1:].tolist()
    page = build_page(ViewConfig(maps=(mosaic,), imagery=(), detail_px=512))
    finest = embedded(page.html)["levels"][-1]
    (piece,) = finest["pieces"]
    np.testing.assert_array_equal(picture(piece["classes"][0]), class_rgba(both, FIVE))


def test_areas_in_a_geographic_crs_follow_the_latitude(tmp_path: Path) -> None:
    codes = np.ones((200, 100), dtype=np.uint8)
    codes[:100] = 2  # the northern half
    lc = write_map(tmp_path / "geo.tif", codes, x0=-77.0, y0=45.0, res=0.001, crs="EPSG:4326")
    water, trees = class_areas(open_map(str(lc)))[:2]
    south, north = 45.0 - 0.2, 45.0
    geodesic, _ = Geod(ellps="WGS84").polygon_area_perimeter(
        [-77.0, -76.9, -76.9, -77.0], [south, south, north, north]
    )
    assert water.area_km2 + trees.area_km2 == pytest.approx(abs(geodesic) / 1e6, rel=5e-3)
    assert water.area_km2 > trees.area_km2  # the southern half is the wider one
    assert water.area_km2 / trees.area_km2 == pytest.approx(
        math.cos(math.radians(44.85)) / math.cos(math.radians(44.95)), rel=1e-3
    )


def test_bad_input_is_one_line_before_any_work(
    mapped: tuple[Path, Path, npt.NDArray[np.uint8]], tmp_path: Path
) -> None:
    lc, scene, _ = mapped
    page = tmp_path / "page.html"
    cases = [
        ([str(tmp_path / "nope.tif")], f"{tmp_path / 'nope.tif'}: no such map"),
        ([str(tmp_path)], f"{tmp_path}: a directory without mosaic.vrt"),
        ([str(scene)], f"{scene}: expected a 1-band uint8 land-cover map (found 4 band(s)"),
        ([str(lc), "--detail", "10"], "Invalid value for '--detail'"),
        ([str(lc), "--imagery", str(tmp_path / "none*.tif")], "none*.tif"),
    ]
    for args, message in cases:
        result = run(*args, "--out", str(page))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, result.output
        assert "Traceback" not in result.output
        assert not page.exists()
    page.write_text("mine")
    result = run(str(lc), "--out", str(page))
    assert result.output == f"error: {page} exists; pass --overwrite to replace it\n"
    assert page.read_text() == "mine"


def test_serve_prints_the_url_serves_only_the_page_and_stops_on_ctrl_c(
    mapped: tuple[Path, Path, npt.NDArray[np.uint8]], tmp_path: Path
) -> None:
    lc, _, _ = mapped
    page = tmp_path / "page.html"
    command = [sys.executable, "-m", "landcover", "-q", "view", str(lc), "--out", str(page)]
    with subprocess.Popen(
        [*command, "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as server:
        try:
            assert server.stdout is not None
            assert server.stdout.readline().startswith(f"wrote {page}")
            served = server.stdout.readline().split()
            assert served[0] == "serving" and served[1].startswith("http://127.0.0.1:")
            url = served[1]
            with urllib.request.urlopen(url, timeout=30) as answer:
                assert answer.read() == page.read_bytes()
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(url.rsplit("/", 1)[0] + "/lc.tif", timeout=30)
        finally:
            server.send_signal(signal.SIGINT)
            _, errors = server.communicate(timeout=30)
    assert server.returncode == 0, errors
    assert "Traceback" not in errors
