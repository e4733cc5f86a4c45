"""What a received map cannot make `landcover view` (and `evaluate`'s panels) do, and areas a
user can trust (issue 41): names run no script in the browser, a map's tags fetch nothing,
`--serve` answers only this machine's loopback names at an address that works for any file
name, class areas are on the ellipsoid in any CRS, and missing tiles and codes outside the
class table are said, not hidden."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.view import PageServer, ViewConfig, build_page, class_areas, open_map
from landcover.view.page import map_warnings
from tests.browser import chromium, render  # noqa: F401  (the session fixture)
from tests.landcover.evaluation.maps import write as write_raster
from tests.landcover.view.maps import (
    FIVE,
    RES_M,
    X0,
    Y0,
    class_blocks,
    geodesic_areas,
    write_map,
    write_mosaic,
    write_scene,
)

SIZE = 64

# --- names in the browser --------------------------------------------------------------------


def test_hostile_map_and_product_names_run_no_script_and_blank_nothing(
    chromium: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    codes = class_blocks(SIZE, SIZE, seed=1)
    cog = write_map(tmp_path / "<img src=x onerror=window.__xss=1>.tif", codes)
    product = tmp_path / "<!--<script>"
    product.mkdir()
    tile = write_map(product / "tile_0_0.tif", codes, x0=X0 + SIZE * RES_M)
    write_mosaic(product, [tile], SIZE, SIZE)
    page = tmp_path / "page.html"
    result = CliRunner().invoke(
        main, ["view", str(cog), str(product), "--out", str(page), "--title", "<b>t</b>"]
    )
    assert result.exit_code == 0, result.output
    shown = render(
        chromium,
        page,
        values={
            "xss": "window.__xss === undefined ? 0 : 1",
            "ran": "window.landcoverView === undefined ? 0 : 1",
            "layers": "Array.from(document.querySelectorAll("
            "'.leaflet-control-layers-overlays label span span')).map(s => s.textContent.trim())",
            "layerImages": "document.querySelectorAll('.leaflet-control-layers img').length",
            "headings": "Array.from(document.querySelectorAll('#side h1, #side h2'))"
            ".map(h => h.textContent)",
        },
    )
    assert shown.errors == []
    assert shown.values["xss"] == 0 and shown.values["layerImages"] == 0
    assert shown.values["ran"] == 1  # the page's script was not swallowed by "<!--<script>"
    assert shown.values["layers"] == [cog.name, product.name]
    assert shown.values["headings"] == ["<b>t</b>", cog.name, product.name]
    assert all(u.startswith(("file:", "data:")) for u in shown.requests), shown.requests


# --- a map's tags fetch nothing --------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:  # a GDAL read would ask for bytes of an image
        self.seen.append(self.path)
        self.send_error(404)

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on the loopback that records every request: (base URL, requests)."""
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", seen
        finally:
            server.shutdown()


def _view(lc: Path, out: Path) -> Any:
    return CliRunner().invoke(main, ["view", str(lc), "--out", str(out / "page.html")])


def _evaluate(lc: Path, out: Path) -> Any:
    raw = np.repeat(np.repeat(class_blocks(SIZE, SIZE, seed=4), 2, axis=0), 2, axis=1)
    raw = np.where(raw == 0, 15, raw).astype(np.uint8)
    truth = write_raster(out / "truth.tif", raw, x0=X0, y0=Y0)
    return CliRunner().invoke(
        main, ["evaluate", str(lc), "--truth", str(truth), "--out", str(out / "report")]
    )


@pytest.mark.parametrize("command", [_view, _evaluate], ids=["view", "evaluate panels"])
def test_images_named_in_a_maps_tags_are_read_only_from_local_files(
    command: Any,
    listener: tuple[str, list[str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base, seen = listener
    scene = write_scene(tmp_path / "scene.tif", SIZE * RES_M, SIZE * RES_M)
    pointing = tmp_path / "pointing.vrt"  # a local file that names a remote one
    pointing.write_text(
        f'<VRTDataset rasterXSize="8" rasterYSize="8"><VRTRasterBand dataType="Byte" band="1">'
        f"<SimpleSource><SourceFilename>/vsicurl/{base}/vrt.tif</SourceFilename>"
        f"<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand></VRTDataset>"
    )
    recorded = [
        f"{base}/receipt.tif",
        f"/vsicurl/{base}/vsicurl.tif",
        f"WMS:{base}/wms",
        f'<VRTDataset rasterXSize="8" rasterYSize="8"><VRTRasterBand dataType="Byte" band="1">'
        f"<SimpleSource><SourceFilename>/vsicurl/{base}/inline.tif</SourceFilename>"
        f"<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand></VRTDataset>",
        str(pointing),
        str(scene),
    ]
    lc = write_map(tmp_path / "lc.tif", class_blocks(SIZE, SIZE, seed=4), sources=recorded)
    with caplog.at_level(logging.WARNING):
        result = command(lc, tmp_path)
    assert result.exit_code == 0, result.output
    assert seen == []
    assert open_map(str(lc)).sources == (str(scene),)  # the local image is still shown
    assert "5 image(s) that are not local image files" in caplog.text
    assert "pass --imagery to show them" in caplog.text


def test_imagery_the_user_passes_is_read_wherever_it_is(
    listener: tuple[str, list[str]], tmp_path: Path
) -> None:
    base, seen = listener
    lc = write_map(tmp_path / "lc.tif", class_blocks(SIZE, SIZE, seed=4))
    build_page(ViewConfig(maps=(open_map(str(lc)),), imagery=(f"/vsicurl/{base}/mine.tif",)))
    assert seen  # asked for: the user named it


# --- --serve ---------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[PageServer]:
    page = tmp_path / "my map é.html"
    page.write_text("<!DOCTYPE html><title>map</title>", encoding="utf-8")
    with PageServer(page) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()


def _get(url: str, host: str | None) -> int:
    request = urllib.request.Request(url)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_serve_prints_a_working_url_for_any_page_name(served: PageServer) -> None:
    assert served.url.isascii() and " " not in served.url
    assert urllib.parse.unquote(served.url).endswith("/my map é.html")
    with urllib.request.urlopen(served.url, timeout=30) as answer:
        assert answer.read() == served.page.read_bytes()
    assert _get(served.url.rsplit("/", 1)[0] + "/other.html", None) == 404


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("localhost:{port}", 200),
        ("LOCALHOST:{port}", 200),
        ("[::1]:{port}", 200),
        ("attacker.example:{port}", 403),  # DNS rebinding: a name of theirs on 127.0.0.1
        ("attacker.example", 403),
        ("127.0.0.1:{other}", 403),
        ("localhost.attacker.example:{port}", 403),
    ],
)
def test_serve_answers_only_loopback_host_names(served: PageServer, host: str, status: int) -> None:
    named = host.format(port=served.port, other=served.port + 1)
    assert _get(served.url, named) == status


def test_serve_refuses_a_request_without_a_host(served: PageServer) -> None:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        connection.putrequest("GET", "/", skip_host=True)
        connection.endheaders()
        assert connection.getresponse().status == 403
    finally:
        connection.close()


# --- areas on the ellipsoid ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("crs", "x0", "y0", "res"),
    [
        ("EPSG:3857", -8_575_000.0, 4_721_000.0, 30.0),  # Web Mercator at 39° N
        ("EPSG:32618", X0 + 200_000.0, Y0, 30.0),  # UTM 18N, 200 km east of its meridian
        ("EPSG:4326", -77.0, 39.2, 0.0003),
        ("EPSG:5070", 1_600_000.0, 1_900_000.0, 30.0),  # Albers equal area: a control
    ],
)
def test_class_areas_are_the_pixels_areas_on_the_ellipsoid(
    crs: str, x0: float, y0: float, res: float, tmp_path: Path
) -> None:
    codes = class_blocks(48, 40, seed=6)
    lc = write_map(tmp_path / "lc.tif", codes, x0=x0, y0=y0, res=res, crs=crs)
    expected = geodesic_areas(lc, codes)
    areas = class_areas(open_map(str(lc)))
    assert [a.code for a in areas] == [c.code for c in FIVE.classes[1:]]
    for a in areas:
        assert a.area_km2 * 1e6 == pytest.approx(expected[a.code], rel=2e-5), a.name
    mapped = expected[1:].sum()
    for a in areas:
        assert a.share == pytest.approx(expected[a.code] / mapped, rel=2e-5)


def test_a_crs_without_an_ellipsoid_gets_nominal_areas_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    codes = class_blocks(40, 48, seed=6)
    local = 'LOCAL_CS["site grid",UNIT["metre",1]]'
    lc = write_map(tmp_path / "lc.tif", codes, crs=local)
    with caplog.at_level(logging.WARNING):
        areas = class_areas(open_map(str(lc)))
    counts = np.bincount(codes.ravel(), minlength=FIVE.num_classes)
    assert [a.area_km2 for a in areas] == pytest.approx(counts[1:] * RES_M**2 / 1e6)
    assert "its CRS has no ellipsoid; areas are the pixels' nominal size" in caplog.text


# --- what is missing is said -----------------------------------------------------------------


@pytest.fixture
def product(tmp_path: Path) -> tuple[Path, list[Path], list[npt.NDArray[np.uint8]]]:
    """A product of three tiles side by side."""
    folder = tmp_path / "product"
    folder.mkdir()
    codes = [class_blocks(SIZE, SIZE, seed=s) for s in (1, 2, 3)]
    tiles = [
        write_map(folder / f"tile_0_{i}.tif", c, x0=X0 + i * SIZE * RES_M)
        for i, c in enumerate(codes)
    ]
    write_mosaic(folder, tiles, SIZE, SIZE)
    return folder, tiles, codes


def _counts(*codes: npt.NDArray[np.uint8]) -> list[int]:
    both = np.concatenate([c.ravel() for c in codes])
    return [int(n) for n in np.bincount(both, minlength=FIVE.num_classes)[1:]]


def test_a_deleted_tile_is_named_and_left_out_of_the_areas(
    product: tuple[Path, list[Path], list[npt.NDArray[np.uint8]]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder, tiles, codes = product
    tiles[1].unlink()
    page = tmp_path / "page.html"
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(main, ["view", str(folder), "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert "1 tile(s) of the product are missing (tile_0_1.tif)" in caplog.text
    html = page.read_text(encoding="utf-8")
    assert '<p class="warning">product: 1 tile(s) missing (tile_0_1.tif)' in html
    opened = open_map(str(folder))
    assert [Path(m).name for m in opened.missing] == ["tile_0_1.tif"]
    assert [a.pixels for a in class_areas(opened)] == _counts(codes[0], codes[2])


def test_a_tile_of_the_collection_left_out_of_the_mosaic_is_named(
    product: tuple[Path, list[Path], list[npt.NDArray[np.uint8]]],
) -> None:
    folder, tiles, _ = product
    links = [{"rel": "item", "href": f"./{t.stem}.json"} for t in [*tiles, folder / "tile_0_3"]]
    (folder / "collection.json").write_text(json.dumps({"type": "Collection", "links": links}))
    opened = open_map(str(folder))
    assert [Path(m).name for m in opened.missing] == ["tile_0_3.tif"]
    (warning,) = map_warnings(opened, class_areas(opened))
    assert warning.startswith("product: 1 tile(s) missing (tile_0_3.tif)")


def test_codes_outside_the_class_table_are_unknown_codes_not_mapped_classes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    codes = class_blocks(SIZE, SIZE, seed=7)
    codes[:8, :16] = 9  # FIVE has codes 0..4
    lc = write_map(tmp_path / "lc.tif", codes)
    with caplog.at_level(logging.WARNING):
        page = build_page(ViewConfig(maps=(open_map(str(lc)),), imagery=()))
    (areas,) = page.areas
    assert [(a.code, a.known) for a in areas] == [
        (1, True),
        (2, True),
        (3, True),
        (4, True),
        (9, False),
    ]
    unknown = areas[-1]
    assert unknown.pixels == 8 * 16 and unknown.name == "unknown code 9"
    assert sum(a.share for a in areas) == pytest.approx(1.0)
    assert unknown.share == pytest.approx(unknown.pixels / int((codes > 0).sum()))
    assert "128 pixel(s) hold codes outside the class table (9)" in caplog.text
    assert '<tr data-code="9"' in page.html and "unknown code 9" in page.html
    assert "hold codes outside the class table (9)" in page.html


def test_file_urls_name_maps_and_products(
    product: tuple[Path, list[Path], list[npt.NDArray[np.uint8]]], tmp_path: Path
) -> None:
    folder, tiles, _ = product
    page = tmp_path / "page.html"
    maps = [tiles[0].as_uri(), f"{folder.as_uri()}/"]
    result = CliRunner().invoke(main, ["view", *maps, "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {page}: 2 map(s)")
    assert [open_map(m).name for m in maps] == ["tile_0_0.tif", "product"]


# --- a received product's mosaic reads only its own tiles ------------------------------------


def _product_commands(folder: Path, out: Path) -> dict[str, list[str]]:
    """Every command that takes a tiled product's directory and reads its mosaic."""
    truth = write_raster(out / "truth.tif", np.full((SIZE, SIZE), 1, np.uint8), x0=X0, y0=Y0)
    return {
        "view": ["view", str(folder), "--out", str(out / "page.html")],
        "evaluate": ["evaluate", str(folder), "--truth", str(truth)],
        "sample": ["sample", str(folder), "--size", "10", "--out", str(out / "s.csv")],
        "change": ["change", str(folder), str(folder), "--out", str(out / "change")],
    }


@pytest.mark.parametrize("command", ["view", "evaluate", "sample", "change"])
@pytest.mark.parametrize(
    "source",
    ["url", "vsicurl", "absolute", "parent", "subfolder", "link out"],
)
def test_a_products_mosaic_that_names_other_files_is_refused_before_reading(
    product: tuple[Path, list[Path], list[npt.NDArray[np.uint8]]],
    listener: tuple[str, list[str]],
    tmp_path: Path,
    command: str,
    source: str,
) -> None:
    folder, tiles, codes = product
    outside = write_map(tmp_path / "secret.tif", codes[1])
    (folder / "sub").mkdir()
    write_map(folder / "sub" / "tile.tif", codes[1])
    (folder / "link.tif").symlink_to(outside)
    base, seen = listener
    named = {
        "url": ('"0"', f"{base}/tile.tif"),
        "vsicurl": ('"0"', f"/vsicurl/{base}/tile.tif"),
        "absolute": ('"0"', str(outside)),
        "parent": ('"1"', "../secret.tif"),
        "subfolder": ('"1"', "sub/tile.tif"),
        "link out": ('"1"', "link.tif"),
    }[source]
    mosaic = folder / "mosaic.vrt"
    mosaic.write_text(
        mosaic.read_text().replace(
            f'<SourceFilename relativeToVRT="1">{tiles[1].name}<',
            f"<SourceFilename relativeToVRT={named[0]}>{named[1]}<",
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, _product_commands(folder, out)[command])
    assert result.exit_code == 2, result.output
    line = result.output.splitlines()[-1]
    assert (
        f"its mosaic.vrt reads 1 file(s) that are not tiles of the product ({named[1]!r})" in line
    )
    assert seen == []
    assert not (out / "page.html").exists() and not (out / "change").exists()


def test_a_products_own_tiles_and_links_among_them_are_read(
    product: tuple[Path, list[Path], list[npt.NDArray[np.uint8]]], tmp_path: Path
) -> None:
    folder, tiles, codes = product
    (folder / "alias.tif").symlink_to(tiles[1].name)
    mosaic = folder / "mosaic.vrt"
    mosaic.write_text(mosaic.read_text().replace(f">{tiles[1].name}<", ">alias.tif<"))
    assert [a.pixels for a in class_areas(open_map(str(folder)))] == _counts(*codes)


def test_a_change_records_maps_that_are_urls_are_not_fetched(
    listener: tuple[str, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: `view CHANGE_DIR` opened the before and after maps its change.json names,
    a URL too (a read receipt for whoever sent the directory)."""
    codes = class_blocks(SIZE, SIZE, seed=5)
    before = write_map(tmp_path / "before.tif", codes)
    after = write_map(tmp_path / "after.tif", np.where(codes == 1, 2, codes).astype(np.uint8))
    out = tmp_path / "change"
    assert (
        CliRunner().invoke(main, ["change", str(before), str(after), "--out", str(out)]).exit_code
        == 0
    )
    base, seen = listener
    record = json.loads((out / "change.json").read_text())
    (out / "change.json").write_text(json.dumps({**record, "before": f"{base}/before.tif"}))
    page = tmp_path / "page.html"
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(main, ["view", str(out), "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert seen == []
    assert (
        f"names maps that are not local files or directories ('{base}/before.tif')" in caplog.text
    )
    assert result.output.startswith(f"wrote {page}: 2 map(s)")  # the change and after
