"""`landcover sample` and `landcover evaluate --reference`: the allocation, the draw (seeded,
streamed in blocks, over one COG, a tiled product or several maps), the sample files, and the
estimates from a labelled sample; bad input is one line each."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.errors import EvaluationError
from landcover.evaluation.referencesample import read_reference_sample
from landcover.evaluation.sampling import (
    SAMPLE_BLOCK_PX,
    SampleConfig,
    allocate,
    draw_sample,
)
from tests.landcover.change.years import retag
from tests.landcover.view.maps import FIVE, RES_M, X0, Y0, class_blocks, write_map, write_mosaic
from tiling.sources.classes import ClassInfo, ClassMap

# wider than one sampling block, so the draw crosses blocks
HEIGHT, WIDTH = 300, SAMPLE_BLOCK_PX + 176


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    return class_blocks(HEIGHT, WIDTH, seed=4)


@pytest.fixture(scope="module")
def cog(codes: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_map(tmp_path_factory.mktemp("map") / "map.tif", codes)


@pytest.fixture(scope="module")
def product(codes: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same map as a tiled product: two tiles side by side under mosaic.vrt."""
    folder = tmp_path_factory.mktemp("product")
    half = WIDTH // 2
    tiles = [
        write_map(folder / "E0.tif", codes[:, :half]),
        write_map(folder / "E1.tif", codes[:, half:], x0=X0 + half * RES_M),
    ]
    write_mosaic(folder, tiles, half, HEIGHT)
    return folder


def test_allocation_is_proportional_with_a_floor_and_adds_up() -> None:
    mapped = np.array([0, 9_000, 800, 100, 100], dtype=np.int64)
    sizes = allocate(mapped, size=400, min_per_class=50, per_class={}, class_map=FIVE)
    assert sizes.tolist() == [0, 250, 50, 50, 50]
    small = allocate(mapped, size=500, min_per_class=110, per_class={}, class_map=FIVE)
    assert small.tolist() == [0, 190, 110, 100, 100]  # classes 3, 4 have only 100 pixels
    fixed = allocate(mapped, size=400, min_per_class=10, per_class={1: 30}, class_map=FIVE)
    assert fixed[1] == 30 and fixed.sum() == 400 and fixed[2] > fixed[3] == fixed[4]


@pytest.mark.parametrize(
    ("size", "per_class", "message"),
    [
        (100, {}, "--size 100 leaves 100 points for 4 classes, fewer than --min-per-class 50"),
        (400, {7: 20}, "--per-class 7=20: no class 7 in the map's table 'chesapeake7to5'"),
        (None, {1: 30}, "class 2 (tree canopy) has 800 pixels but would get 0 point(s)"),
        (400, {1: 30, 2: 1}, "class 2 (tree canopy) has 800 pixels but would get 1 point(s)"),
        (20, {1: 30}, "--per-class asks for 30 points, more than --size 20"),
    ],
)
def test_an_allocation_that_cannot_be_is_refused(
    size: int | None, per_class: dict[int, int], message: str
) -> None:
    mapped = np.array([0, 9_000, 800, 100, 100], dtype=np.int64)
    with pytest.raises(EvaluationError) as caught:
        allocate(mapped, size=size, min_per_class=50, per_class=per_class, class_map=FIVE)
    assert message in str(caught.value)


def test_the_same_seed_draws_the_same_points_on_their_classes(cog: Path, codes: np.ndarray) -> None:
    config = SampleConfig(maps=(str(cog),), size=240, min_per_class=40, seed=7)
    first, again = draw_sample(config), draw_sample(config)
    assert np.array_equal(first.x, again.x) and np.array_equal(first.y, again.y)
    other = draw_sample(SampleConfig(maps=(str(cog),), size=240, min_per_class=40, seed=8))
    assert not np.array_equal(first.x, other.x)
    cols = ((first.x - X0) / RES_M).astype(int)
    rows = ((Y0 - first.y) / RES_M).astype(int)
    assert np.array_equal(codes[rows, cols], first.map_code)  # each point on its class
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) == len(first)  # distinct
    assert np.bincount(first.map_code, minlength=5).tolist() == first.sample_sizes.tolist()
    assert first.sample_sizes.sum() == 240
    assert (cols >= SAMPLE_BLOCK_PX).any() and (cols < SAMPLE_BLOCK_PX).any()
    expected = np.bincount(codes.ravel(), minlength=5)
    expected[0] = 0
    assert first.mapped_pixels.tolist() == expected.tolist()


def test_a_tiled_product_gives_the_points_of_the_one_cog(cog: Path, product: Path) -> None:
    one = draw_sample(SampleConfig(maps=(str(cog),), size=200, seed=1))
    tiled = draw_sample(SampleConfig(maps=(str(product),), size=200, seed=1))
    assert np.array_equal(one.x, tiled.x) and np.array_equal(one.y, tiled.y)


@pytest.mark.parametrize("suffix", [".csv", ".gpkg"])
def test_sample_files_are_identical_for_one_seed_and_read_back(
    cog: Path, tmp_path: Path, suffix: str
) -> None:
    paths = [tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"]
    for path in paths:
        time.sleep(1.1)  # GeoPackage time stamps have whole seconds: a stamp would differ
        code, out = run("sample", str(cog), "--out", str(path), "--size", "220", "--seed", "3")
        assert code == 0, out
    back = read_reference_sample(str(paths[0]))
    again = read_reference_sample(str(paths[1]))
    assert np.array_equal(back.x, again.x) and np.array_equal(back.y, again.y)
    assert len(back) == 220 and back.has_reference and set(back.references) == {""}
    assert paths[0].read_bytes() == paths[1].read_bytes()
    if suffix == ".csv":
        header = paths[0].read_text().splitlines()[0]
        assert header.endswith(",inclusion_probability,reference")
    code, out = run("sample", str(cog), "--out", str(paths[0]), "--size", "220")
    assert code != 0 and "--overwrite" in out


def _fill(sample: Path, out: Path, codes: np.ndarray, *, wrong_every: int = 0) -> None:
    """Write `sample` with its reference column filled from the truth `codes` (every
    `wrong_every`-th point labelled one class off)."""
    rows = list(csv.DictReader(sample.open()))
    for i, row in enumerate(rows):
        c = int((float(row["x"]) - X0) / RES_M)
        r = int((Y0 - float(row["y"])) / RES_M)
        truth = int(codes[r, c])
        if wrong_every and i % wrong_every == 0:
            truth = 1 + truth % 4
        row["reference"] = FIVE.classes[truth].name if i % 2 else str(truth)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_evaluate_a_labelled_sample_writes_json_markdown_and_html(
    cog: Path, codes: np.ndarray, tmp_path: Path
) -> None:
    sample, filled = tmp_path / "s.csv", tmp_path / "filled.csv"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300")[0] == 0
    _fill(sample, filled, codes)
    code, out = run("evaluate", str(cog), "--reference", str(filled), "--out", str(tmp_path / "r"))
    assert code == 0, out
    doc = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert doc["overall_accuracy"] == 1.0  # the map is its own truth here
    for c in doc["classes"]:  # a perfect sample estimates the mapped area exactly
        assert c["area"] == pytest.approx(c["mapped_area"], rel=1e-12)
        assert c["mapped_area"] == pytest.approx(c["mapped_pixels"] * RES_M**2 / 1e6, rel=1e-3)
    assert "## Error matrix of estimated area proportions" in out
    assert (tmp_path / "r" / "metrics.md").read_text() == out
    assert "<h2>Area</h2>" in (tmp_path / "r" / "report.html").read_text()


def test_the_reference_raster_labels_the_points(
    cog: Path, codes: np.ndarray, tmp_path: Path
) -> None:
    """Labels from a truth raster equal labels typed from the same truth."""
    sample, filled = tmp_path / "s.gpkg", tmp_path / "filled.csv"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300", "--seed", "2")[0] == 0
    truth = codes.copy()
    truth[:40, :] = 1 + truth[:40, :] % 4  # the truth differs from the map in a strip
    truth[:, WIDTH - WIDTH // 10 :] = 0
    truth_path = write_map(tmp_path / "truth.tif", truth)
    code, by_raster = run(
        "evaluate", str(cog), "--reference", str(sample), "--reference-raster", str(truth_path),
        "--json",
    )  # fmt: skip
    assert code == 0, by_raster
    csv_sample = tmp_path / "s.csv"
    assert run("sample", str(cog), "--out", str(csv_sample), "--size", "300", "--seed", "2")[0] == 0
    _fill(csv_sample, filled, truth)
    code, by_hand = run("evaluate", str(cog), "--reference", str(filled), "--json")
    assert code == 0, by_hand
    a, b = json.loads(by_raster), json.loads(by_hand)
    assert a["error_matrix"]["counts"] == b["error_matrix"]["counts"]
    assert a["overall_accuracy"] < 1.0


def _table(name: str) -> ClassMap:
    classes = (ClassInfo(0, "nodata", (0, 0, 0)), *FIVE.classes[1:4], ClassInfo(4, name, (9, 9, 9)))
    return ClassMap("custom", classes, {k: k for k in range(5)})


def test_class_names_are_escaped_in_the_page_and_the_markdown(
    codes: np.ndarray, tmp_path: Path
) -> None:
    hostile = "<img src=x onerror=alert(1)>$x$"
    path = retag(write_map(tmp_path / "m.tif", codes), _table(hostile))
    sample = tmp_path / "s.csv"
    assert run("sample", str(path), "--out", str(sample), "--size", "300")[0] == 0
    _fill(sample, tmp_path / "f.csv", codes)
    rows = (tmp_path / "f.csv").read_text().replace(",barren / impervious", f",{hostile}")
    (tmp_path / "f.csv").write_text(rows)
    code, out = run("evaluate", str(path), "--reference", str(tmp_path / "f.csv"), "--out",
                    str(tmp_path / "r"))  # fmt: skip
    assert code == 0, out
    page = (tmp_path / "r" / "report.html").read_text()
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    markdown = (tmp_path / "r" / "metrics.md").read_text()
    assert hostile not in markdown and "&lt;img src=x onerror=alert(1)&gt;\\$x\\$" in markdown


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("no-column", "has no 'reference' column"),
        ("unknown", "references 9, forest name no class of 'chesapeake7to5'"),
        ("empty", "1 of 300 points have no reference (rows 1)"),
        ("drop-stratum", "stratum 4 (barren / impervious) covers"),
        ("off-map", "1 of 300 points lie outside"),
        ("duplicate", "rows 1 and 301 are the same pixel"),
        ("other-map", "1 of 300 points have a map_code other than the class of"),
        ("blank-x", "row 1 has x '', y"),
        ("text-y", "row 1 has x"),
    ],
)
def test_a_bad_sample_is_refused_in_one_line(
    cog: Path, codes: np.ndarray, tmp_path: Path, edit: str, message: str
) -> None:
    sample, filled = tmp_path / "s.csv", tmp_path / "filled.csv"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300")[0] == 0
    _fill(sample, filled, codes)
    rows = list(csv.DictReader(filled.open()))
    if edit == "no-column":
        for row in rows:
            del row["reference"]
    elif edit == "unknown":
        rows[0]["reference"], rows[1]["reference"] = "9", "forest"
    elif edit == "empty":
        rows[0]["reference"] = ""
    elif edit == "drop-stratum":
        rows = [r for r in rows if r["map_code"] != "4"] + [
            next(r for r in rows if r["map_code"] == "4")
        ]
    elif edit == "off-map":
        rows[0]["x"] = str(X0 - 10)
    elif edit == "blank-x":
        rows[0]["x"] = ""
    elif edit == "text-y":
        rows[0]["y"] = "n/a"
    elif edit == "duplicate":
        rows.append(dict(rows[0], id="301"))
    elif edit == "other-map":  # a sample of another map: its strata are not this map's
        rows[0]["map_code"] = str(1 + int(rows[0]["map_code"]) % 4)
    with filled.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    code, out = run("evaluate", str(cog), "--reference", str(filled))
    assert code == 2
    assert message in out
    assert out.count("\n") == 1


@pytest.mark.parametrize("bad", ["class-table", "crs", "overlap"])
def test_maps_that_are_not_one_population_are_refused(
    codes: np.ndarray, tmp_path: Path, bad: str
) -> None:
    first = write_map(tmp_path / "a.tif", codes)
    x0 = X0 + WIDTH * RES_M
    if bad == "class-table":
        second = retag(write_map(tmp_path / "b.tif", codes, x0=x0), _table("quarry"))
        message = "sample maps of one class table"
    elif bad == "crs":
        second = write_map(tmp_path / "b.tif", codes, x0=x0, crs="EPSG:32617")
        message = "warp them onto one CRS"
    else:
        second = write_map(tmp_path / "b.tif", codes, x0=X0 + 10 * RES_M)
        message = "overlap, so their shared pixels would count twice"
    code, out = run("sample", str(first), str(second), "--out", str(tmp_path / "s.csv"),
                    "--size", "300")  # fmt: skip
    assert code == 2 and message in out and out.count("\n") == 1
    assert not (tmp_path / "s.csv").exists()


def test_evaluate_takes_truth_or_a_sample(cog: Path, tmp_path: Path) -> None:
    code, out = run("evaluate", str(cog))
    assert code == 2 and "give --truth RASTER" in out
    code, out = run("evaluate", str(cog), "--reference", str(tmp_path / "s.txt"))
    assert code == 2 and "a sample is a GeoPackage (.gpkg) or a CSV (.csv) file" in out
    with rasterio.open(cog) as ds:
        assert ds.count == 1


def test_a_geopackage_labelled_in_place_is_scored(
    cog: Path, codes: np.ndarray, tmp_path: Path
) -> None:
    """The GeoPackage as QGIS leaves it: the reference column filled, nothing else changed."""
    import pyogrio.raw  # type: ignore[import-untyped]

    sample = tmp_path / "s.gpkg"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300")[0] == 0
    meta, _, geometry, data = pyogrio.raw.read(sample)
    fields = list(meta["fields"])
    xs, ys = data[fields.index("x")], data[fields.index("y")]
    cols, rows = ((xs - X0) / RES_M).astype(int), ((Y0 - ys) / RES_M).astype(int)
    data[fields.index("reference")] = np.array([str(c) for c in codes[rows, cols]], dtype=object)
    labelled = tmp_path / "labelled.gpkg"
    pyogrio.raw.write(labelled, geometry, data, fields=fields, crs=meta["crs"], driver="GPKG",
                      geometry_type="Point")  # fmt: skip
    code, out = run("evaluate", str(cog), "--reference", str(labelled), "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["overall_accuracy"] == 1.0 and doc["sample_size"] == 300


@pytest.mark.parametrize("command", ["sample", "evaluate --reference", "change"])
def test_a_map_with_codes_outside_its_class_table_is_refused(
    command: str, codes: np.ndarray, tmp_path: Path
) -> None:
    bad = codes.copy()
    bad[5, 7] = 9
    path = write_map(tmp_path / "bad.tif", bad)
    if command == "sample":
        args = ["sample", str(path), "--out", str(tmp_path / "s.csv"), "--size", "300"]
    elif command == "change":
        args = ["change", str(path), str(path), "--out", str(tmp_path / "c")]
    else:
        labelled = tmp_path / "l.csv"
        labelled.write_text(f"x,y,reference\n{X0 + 0.5},{Y0 - 0.5},1\n")
        args = ["evaluate", str(path), "--reference", str(labelled)]
    code, out = run(*args)
    assert code == 2 and "holds class codes 9 outside its class table" in out, out
    assert out.count("\n") == 1


@pytest.mark.parametrize("sign", ["=", "+", "-", "@"])
def test_class_names_that_start_a_formula_are_inert_in_the_csv_and_read_back(
    codes: np.ndarray, tmp_path: Path, sign: str
) -> None:
    """A spreadsheet runs a cell that starts with = + - @ (CSV injection): the sample's
    map_class cell is quoted with a leading ', and a reference copied from it names the
    class."""
    name = f'{sign}HYPERLINK("http://x","y")'
    path = retag(write_map(tmp_path / "m.tif", codes), _table(name))
    sample = tmp_path / "s.csv"
    assert run("sample", str(path), "--out", str(sample), "--size", "300")[0] == 0
    rows = list(csv.DictReader(sample.open()))
    cells = {r["map_class"] for r in rows}
    assert f"'{name}" in cells and not any(c.startswith(("=", "+", "-", "@")) for c in cells)
    assert any(float(r["lon"]) < 0 for r in rows)  # numbers stay numbers
    for row in rows:
        row["reference"] = row["map_class"]  # as a person copies the cell
    with (tmp_path / "f.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    code, out = run("evaluate", str(path), "--reference", str(tmp_path / "f.csv"), "--json")
    assert code == 0, out
    assert json.loads(out)["overall_accuracy"] == 1.0


def test_a_reference_saved_as_a_decimal_names_its_code(cog: Path, codes: np.ndarray,
                                                       tmp_path: Path) -> None:  # fmt: skip
    """A spreadsheet may save the code 2 as 2.0."""
    sample, filled = tmp_path / "s.csv", tmp_path / "f.csv"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300")[0] == 0
    _fill(sample, filled, codes)
    rows = list(csv.DictReader(filled.open()))
    for row in rows:
        row["reference"] = f"{float(row['map_code']):.1f}"
    with filled.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    code, out = run("evaluate", str(cog), "--reference", str(filled), "--json")
    assert code == 0, out
    assert json.loads(out)["overall_accuracy"] == 1.0


def test_a_class_of_one_pixel_is_a_census_stratum(codes: np.ndarray, tmp_path: Path) -> None:
    """A class with one pixel gets its one point; the sample is scored (that stratum is known
    exactly: no variance), not refused as an empty stratum."""
    one = codes.copy()
    one[one == 4] = 3
    one[10, 10] = 4
    path = write_map(tmp_path / "m.tif", one)
    sample, filled = tmp_path / "s.csv", tmp_path / "f.csv"
    code, out = run("sample", str(path), "--out", str(sample), "--size", "300")
    assert code == 0 and "barren / impervious 1" in out, out
    _fill(sample, filled, one)
    code, out = run("evaluate", str(path), "--reference", str(filled), "--json")
    assert code == 0, out
    barren = json.loads(out)["classes"][3]
    assert barren["mapped_pixels"] == 1 and barren["sample_size"] == 1
    assert barren["area"] == pytest.approx(RES_M**2 / 1e6, rel=1e-3) and barren["area_se"] == 0.0
    assert barren["users_accuracy"] == 1.0 and barren["users_accuracy_se"] == 0.0


IMPORTS_TORCH = """
import sys
from click.testing import CliRunner
from landcover.cli.app import main
result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
print("torch" in sys.modules)
"""


@pytest.mark.parametrize("command", ["sample", "evaluate --reference"])
def test_sampling_a_map_file_does_not_import_torch(
    command: str, cog: Path, codes: np.ndarray, tmp_path: Path
) -> None:
    """No model is involved: the command does not pay torch's import (seconds, and most of
    its memory)."""
    import subprocess
    import sys

    sample = tmp_path / "s.csv"
    args = ["sample", str(cog), "--out", str(sample), "--size", "300"]
    if command != "sample":
        assert run(*args)[0] == 0
        _fill(sample, tmp_path / "f.csv", codes)
        args = ["evaluate", str(cog), "--reference", str(tmp_path / "f.csv")]
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_TORCH, *args], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_values_at_points_read_each_block_once(cog: Path, codes: np.ndarray) -> None:
    """The map (and a truth raster) under the sample's points: the values of a read per
    point, but each block of the file that holds points is read once."""
    from landcover.evaluation.sampling import values_at

    rng = np.random.default_rng(0)
    rows = rng.integers(0, HEIGHT, 2_000)
    cols = rng.integers(0, WIDTH, 2_000)
    with rasterio.open(cog) as ds:
        reads = []
        read = ds.read

        def counted(*args: object, **kwargs: object) -> np.ndarray:
            reads.append(kwargs.get("window"))
            return read(*args, **kwargs)  # type: ignore[arg-type,no-any-return]

        ds.read = counted  # type: ignore[method-assign]
        values = values_at(ds, rows, cols)
        bh, bw = ds.block_shapes[0]
    assert np.array_equal(values, codes[rows, cols])
    blocks = {(r // bh, c // bw) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
    assert len(reads) == len(blocks) < len(rows)


def test_column_names_are_read_as_a_spreadsheet_may_leave_them(
    cog: Path, codes: np.ndarray, tmp_path: Path
) -> None:
    """ "Reference", " X " are the columns reference and x."""
    sample, filled = tmp_path / "s.csv", tmp_path / "f.csv"
    assert run("sample", str(cog), "--out", str(sample), "--size", "300")[0] == 0
    _fill(sample, filled, codes)
    lines = filled.read_text().splitlines()
    header = lines[0].replace("reference", "Reference").replace(",x,", ", X ,")
    filled.write_text("\n".join([header, *lines[1:]]) + "\n")
    code, out = run("evaluate", str(cog), "--reference", str(filled), "--json")
    assert code == 0, out
    assert json.loads(out)["overall_accuracy"] == 1.0
