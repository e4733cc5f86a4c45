"""`landcover change`: the transition matrix of two synthetic years with a known edit is
exact, the change COG holds the from-to codes with a colour table and names, a tiled product
works as input, `landcover view DIR` shows the change over both maps, and maps that cannot be
compared are refused in one line each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner
from rasterio.windows import Window

from landcover.change import Transitions, change_class_map, transitions_png
from landcover.cli.app import main
from landcover.evaluation.sampling import window_pixel_m2
from landcover.view.areas import cell_areas, class_areas
from landcover.view.mapfile import open_map
from tests.landcover.change.years import (
    IMPERVIOUS,
    TREE,
    map_from_labels,
    retag,
    second_year,
    true_transitions,
)
from tests.landcover.view.maps import FIVE, RES_M, X0, class_blocks, write_map, write_mosaic
from tiling.sources.classes import ClassInfo, ClassMap
from tiling.synthetic.scenes import SynthResult


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def years(
    tiny_scenes: SynthResult, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    folder = tmp_path_factory.mktemp("years")
    first, before = map_from_labels(tiny_scenes.label_paths[0], folder / "2018.tif")
    second, after = second_year(before, folder / "2020.tif", first, slice(100, 300), slice(50, 350))
    return first, second, before, after


def test_the_transitions_of_two_years_are_exact(
    years: tuple[Path, Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    first, second, before, after = years
    out = tmp_path / "change"
    code, text = run("change", str(first), str(second), "--out", str(out))
    assert code == 0, text
    doc = json.loads((out / "change.json").read_text())
    expected = true_transitions(before, after)
    assert doc["transitions"]["pixels"] == expected.tolist()
    lost = int(expected[TREE - 1, IMPERVIOUS - 1])
    assert lost > 0 and expected.sum() - np.trace(expected) == lost  # the one edit, no other
    # areas on the ellipsoid, as view measures them
    pixel_m2 = window_pixel_m2(cell_areas(open_map(str(first))), Window(0, 0, *before.shape[::-1]))
    lost_km2 = float(pixel_m2[(before == TREE) & (after == IMPERVIOUS)].sum()) / 1e6
    tree = next(c for c in doc["classes"] if c["code"] == TREE)
    assert tree["loss_km2"] == pytest.approx(lost_km2)
    assert tree["net_km2"] == pytest.approx(-lost_km2)
    impervious = next(c for c in doc["classes"] if c["code"] == IMPERVIOUS)
    assert impervious["gain_km2"] == pytest.approx(lost_km2)
    with rasterio.open(out / "change.tif") as ds:
        codes = ds.read(1)
        assert ds.colormap(1)[(TREE - 1) * 4 + IMPERVIOUS][:3] == FIVE.classes[IMPERVIOUS].color
        table = ClassMap.from_json(json.loads(ds.tags()["LANDCOVER_CLASS_MAP"]))
    assert table.class_names[(TREE - 1) * 4 + IMPERVIOUS] == "tree canopy→barren / impervious"
    both = (before > 0) & (after > 0)
    assert np.array_equal(codes[both], ((before - 1) * 4 + after)[both])
    lost_code = (TREE - 1) * 4 + IMPERVIOUS
    kept_codes = [(c - 1) * 4 + c for c in range(1, 5) if expected[c - 1, c - 1]]
    assert not codes[~both].any()
    assert "| tree canopy |" in (out / "change.md").read_text()
    assert (out / "change.png").read_bytes()[:4] == b"\x89PNG"
    # the change directory is a map that sample and evaluate --reference take
    sample = tmp_path / "sample.csv"
    code, text = run("sample", str(out), "--out", str(sample), "--per-class", f"{lost_code}=20",
                     *(arg for c in kept_codes for arg in ("--per-class", f"{c}=5")))  # fmt: skip
    assert code == 0, text
    assert "tree canopy→barren / impervious 20" in text
    assert sorted(p.name for p in out.iterdir()) == [
        "change.json", "change.md", "change.png", "change.tif",
    ]  # fmt: skip


def test_a_tiled_product_in_gives_the_change_of_the_one_cog(tmp_path: Path) -> None:
    codes = class_blocks(200, 260, seed=2)
    later = codes.copy()
    later[20:120, 30:90] = 3
    cog_before = write_map(tmp_path / "before.tif", codes)
    cog_after = write_map(tmp_path / "after.tif", later)
    product = tmp_path / "product"
    product.mkdir()
    tiles = [
        write_map(product / "E0.tif", codes[:, :130]),
        write_map(product / "E1.tif", codes[:, 130:], x0=X0 + 130 * RES_M),
    ]
    write_mosaic(product, tiles, 130, 200)
    assert run("change", str(cog_before), str(cog_after), "--out", str(tmp_path / "a"))[0] == 0
    assert run("change", str(product), str(cog_after), "--out", str(tmp_path / "b"))[0] == 0
    a = json.loads((tmp_path / "a" / "change.json").read_text())
    b = json.loads((tmp_path / "b" / "change.json").read_text())
    assert a["transitions"]["pixels"] == b["transitions"]["pixels"]
    # the same areas, summed over other blocks
    assert np.allclose(a["transitions"]["km2"], b["transitions"]["km2"], rtol=1e-12, atol=0)
    # a tiled product out: a change tile per tile and their mosaic, pixel for pixel the COG
    assert a["map"] == "change.tif" and b["map"] == "mosaic.vrt"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "E0.tif", "E1.tif", "change.json", "change.md", "change.png", "mosaic.vrt",
    ]  # fmt: skip
    with (
        rasterio.open(tmp_path / "a" / "change.tif") as one,
        rasterio.open(tmp_path / "b" / "mosaic.vrt") as tiled,
    ):
        assert np.array_equal(one.read(1), tiled.read(1))
        assert tiled.transform == one.transform
    with rasterio.open(tmp_path / "b" / "E1.tif") as tile:
        assert tile.colormap(1)[2][:3] == FIVE.classes[2].color  # water→tree canopy
    code, text = run("sample", str(tmp_path / "b"), "--out", str(tmp_path / "b.csv"),
                     "--size", "300", "--min-per-class", "2")  # fmt: skip
    assert code == 0, text
    (product / "E1.tif").rename(product / "gone.tif")
    code, text = run("change", str(product), str(cog_after), "--out", str(tmp_path / "d"))
    assert code == 2 and "1 tile(s) of the product are missing (" in text, text
    code, text = run("sample", str(product), "--out", str(tmp_path / "s.csv"), "--size", "300")
    assert code == 2 and "1 tile(s) of the product are missing (" in text, text
    (product / "gone.tif").rename(product / "E1.tif")
    page = tmp_path / "page.html"
    code, text = run("view", str(tmp_path / "b"), "--out", str(page))
    assert code == 0, text
    assert "3 map(s)" in text
    html = page.read_text()
    assert "Change from product to after.tif" in html and "tree canopy→low vegetation" in html


def test_resample_warps_after_onto_the_grid_of_before(tmp_path: Path) -> None:
    codes = class_blocks(120, 160, seed=5)
    before = write_map(tmp_path / "before.tif", codes)
    # the same map, one pixel to the east of the grid, as a map half the resolution
    shifted = write_map(tmp_path / "after.tif", codes, x0=X0 + RES_M)
    code, text = run("change", str(before), str(shifted), "--out", str(tmp_path / "c"))
    assert code == 2 and "is not on the grid of" in text and "--resample" in text
    code, text = run("change", str(before), str(shifted), "--out", str(tmp_path / "c"),
                     "--resample")  # fmt: skip
    assert code == 0, text
    doc = json.loads((tmp_path / "c" / "change.json").read_text())
    assert doc["resampled"] is True
    expected = codes.copy()
    expected[:, 1:] = codes[:, :-1]  # after, read on before's grid
    expected[:, 0] = 0
    after = np.where(codes > 0, expected, 0).astype(np.uint8)
    assert doc["transitions"]["pixels"] == _counts(codes, after).tolist()


def _counts(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    both = (before > 0) & (after > 0)
    flat = (before[both].astype(np.int64) - 1) * 4 + (after[both].astype(np.int64) - 1)
    return np.bincount(flat, minlength=16).reshape(4, 4)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("class-table", "change needs maps of one class table"),
        ("crs", "is in EPSG:32617 and"),
        ("size", "is not on the grid of"),
        ("exists", "--overwrite"),
        ("out-is-file", "exists and is not a directory"),
        ("apart", "share no pixel that both classify"),
        ("all-nodata", "share no pixel that both classify"),
        ("unknown-codes", "holds class codes 7, 9 outside its class table"),
    ],
)
def test_maps_that_cannot_be_compared_are_refused_in_one_line(
    tmp_path: Path, bad: str, message: str
) -> None:
    codes = class_blocks(60, 80, seed=1)
    before = write_map(tmp_path / "before.tif", codes)
    after = write_map(tmp_path / "after.tif", codes)
    out = tmp_path / "out"
    if bad == "class-table":
        other = ClassMap(
            "other",
            (*FIVE.classes[:4], ClassInfo(4, "quarry", (1, 2, 3))),
            {k: k for k in range(5)},
        )
        after = retag(write_map(tmp_path / "other.tif", codes), other)
    elif bad == "crs":
        after = write_map(tmp_path / "other.tif", codes, crs="EPSG:32617")
    elif bad == "size":
        after = write_map(tmp_path / "other.tif", codes[:, :70])
    elif bad == "exists":
        out.mkdir()
        (out / "change.md").write_text("earlier")
    elif bad == "out-is-file":
        out.write_text("a file")
    elif bad == "apart":  # warped onto BEFORE's grid, a map of another place is all nodata
        after = write_map(tmp_path / "other.tif", codes, crs="EPSG:32617")
    elif bad == "all-nodata":
        after = write_map(tmp_path / "other.tif", np.zeros_like(codes))
    elif bad == "unknown-codes":
        strange = codes.copy()
        strange[0, :3] = (9, 7, 9)
        after = write_map(tmp_path / "other.tif", strange)
    resample = ["--resample"] if bad == "apart" else []
    code, text = run("change", str(before), str(after), "--out", str(out), *resample)
    assert code == 2 and message in text and text.count("\n") == 1, text
    if bad == "exists":
        assert sorted(p.name for p in out.iterdir()) == ["change.md"]
    elif bad != "out-is-file":
        assert not out.exists() or not any(out.iterdir())


def test_class_names_with_dollars_are_plain_text_in_the_plot() -> None:
    """A `$...$` in a name would be parsed as mathtext (and `\\undefined` fail the draw)."""
    table = ClassMap(
        "dollars",
        (ClassInfo(0, "nodata", (0, 0, 0)), ClassInfo(1, r"cost $\undefined$", (9, 9, 9)),
         ClassInfo(2, "b", (200, 9, 9))),
        {0: 0, 1: 1, 2: 2},
    )  # fmt: skip
    t = Transitions("a", "b", table, np.array([[5, 1], [0, 3]]), np.array([[5, 1], [0, 3]]) * 1e-6)
    assert transitions_png(t)[:4] == b"\x89PNG"
    assert change_class_map(table).class_names[2] == r"cost $\undefined$→b"


def test_the_change_record_round_trips_and_a_newer_one_is_refused() -> None:
    from landcover.errors import ChangeError

    t = Transitions("a.tif", "b.tif", FIVE, np.arange(16).reshape(4, 4), np.ones((4, 4)) / 3)
    back = Transitions.from_json(json.loads(json.dumps(t.to_json())))
    assert np.array_equal(back.pixels, t.pixels) and back.class_map == FIVE
    assert np.array_equal(back.km2, t.km2)
    newer = {**t.to_json(), "version": 99}
    with pytest.raises(ChangeError, match="upgrade landcover"):
        Transitions.from_json(newer)


def _two_maps(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    codes = class_blocks(60, 80, seed=3)
    later = codes.copy()
    later[10:30, 20:50] = 3
    return write_map(tmp_path / "b.tif", codes), write_map(tmp_path / "a.tif", later), codes


def _tiled(folder: Path, codes: np.ndarray) -> Path:
    folder.mkdir()
    tiles = [
        write_map(folder / "E0.tif", codes[:, :40]),
        write_map(folder / "E1.tif", codes[:, 40:], x0=X0 + 40 * RES_M),
    ]
    write_mosaic(folder, tiles, 40, codes.shape[0])
    return folder


def test_overwrite_leaves_nothing_of_the_old_change(tmp_path: Path) -> None:
    """A tiled change replaced by a one-COG change (and back): none of the old change's
    files stay; a file of the user's in the directory is refused without --overwrite and
    kept with it."""
    before, after, codes = _two_maps(tmp_path)
    product = _tiled(tmp_path / "product", codes)
    out = tmp_path / "out"
    assert run("change", str(product), str(after), "--out", str(out))[0] == 0
    assert {"E0.tif", "E1.tif", "mosaic.vrt"} <= {p.name for p in out.iterdir()}
    code, text = run("change", str(before), str(after), "--out", str(out), "--overwrite")
    assert code == 0, text
    one = ["change.json", "change.md", "change.png", "change.tif"]
    assert sorted(p.name for p in out.iterdir()) == one
    (out / "notes.txt").write_text("mine")
    code, text = run("change", str(product), str(after), "--out", str(out))
    assert code == 2 and "--overwrite" in text and text.count("\n") == 1, text
    code, text = run("change", str(product), str(after), "--out", str(out), "--overwrite")
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["E0.tif", "E1.tif", "change.json", "change.md", "change.png", "mosaic.vrt", "notes.txt"]
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, text = run("change", str(before), str(after), "--out", str(other))
    assert code == 2 and "notes.txt exists" in text and text.count("\n") == 1, text
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


KILLED_RUN = """
import os, signal, sys
import landcover.change.changemap as changemap
from landcover.change import ChangeConfig, run_change

mover = changemap._mover

def dies_after_the_first(made):
    move = mover(made)
    def moved(tmp):
        move(tmp)
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 while the files are put in place
    return moved

changemap._mover = dies_after_the_first
run_change(ChangeConfig(sys.argv[1], sys.argv[2], sys.argv[3], overwrite=True))
"""


def test_a_change_killed_while_it_replaces_another_leaves_nothing_to_trust(
    tmp_path: Path,
) -> None:
    """kill -9 while --overwrite puts the new change in place: the old record is gone (no
    reader pairs it with the new map), and a rerun with --overwrite leaves exactly the new
    change, without the killed run's leftovers."""
    import subprocess
    import sys

    from landcover.change import read_change_record

    before, after, codes = _two_maps(tmp_path)
    product = _tiled(tmp_path / "product", codes)
    out = tmp_path / "out"
    assert run("change", str(product), str(after), "--out", str(out))[0] == 0
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(before), str(after), str(out)], check=False
    )
    assert killed.returncode == -9
    assert read_change_record(out) is None
    code, text = run("change", str(before), str(after), "--out", str(out))
    assert code == 2 and "--overwrite" in text, text
    code, text = run("change", str(before), str(after), "--out", str(out), "--overwrite")
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir()) == [
        "change.json", "change.md", "change.png", "change.tif",
    ]  # fmt: skip
    record = read_change_record(out)
    assert record is not None and record.files == ("change.tif",)


@pytest.mark.parametrize(
    ("crs", "res", "x0", "y0"),
    [
        ("EPSG:32618", RES_M, X0, 4_300_000.0),  # UTM: close to the nominal size
        ("EPSG:3857", 30.0, -8_500_000.0, 4_700_000.0),  # Web Mercator at 39° N: far from it
        ("EPSG:4326", 0.001, -77.0, 39.0),  # degrees: no nominal size at all
    ],
)
def test_areas_are_measured_on_the_ellipsoid_as_view_measures_them(
    tmp_path: Path, crs: str, res: float, x0: float, y0: float
) -> None:
    """change's areas before, and evaluate --reference's mapped areas, equal view's class
    areas (one measure of a pixel's area) in a projected, a Web Mercator and a geographic
    CRS; before, the geographic map was refused and the others counted at nominal size."""
    codes = class_blocks(60, 80, seed=5)
    later = codes.copy()
    later[5:25, 10:40] = 2
    before = write_map(tmp_path / "b.tif", codes, crs=crs, res=res, x0=x0, y0=y0)
    after = write_map(tmp_path / "a.tif", later, crs=crs, res=res, x0=x0, y0=y0)
    code, text = run("change", str(before), str(after), "--out", str(tmp_path / "c"))
    assert code == 0, text
    doc = json.loads((tmp_path / "c" / "change.json").read_text())
    view = {a.code: a.area_km2 for a in class_areas(open_map(str(before)))}
    for c in doc["classes"]:
        assert c["before_km2"] == pytest.approx(view[c["code"]], rel=1e-9)
    sample = tmp_path / "s.csv"
    assert run("sample", str(before), "--out", str(sample), "--size", "200",
               "--min-per-class", "10")[0] == 0  # fmt: skip
    lines = sample.read_text().splitlines()
    rows = [line.split(",") for line in lines[1:]]
    filled = [",".join([*r[:-1], r[5]]) for r in rows]  # reference = map_code
    sample.write_text("\n".join([lines[0], *filled]) + "\n")
    code, out = run("evaluate", str(before), "--reference", str(sample), "--json")
    assert code == 0, out
    for c in json.loads(out)["classes"]:
        assert c["mapped_area"] == pytest.approx(view[c["code"]], rel=1e-9)
        assert c["area"] == pytest.approx(view[c["code"]], rel=1e-9)  # a perfect sample


def _limited_to(size_bytes: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (size_bytes, resource.RLIM_INFINITY))


@pytest.mark.parametrize("command", ["change", "sample .gpkg", "sample .csv"])
def test_a_write_the_file_system_refuses_is_one_line_and_leaves_nothing(
    command: str, tmp_path: Path
) -> None:
    """`ulimit -f` (EFBIG, as a full disk; Python ignores SIGXFSZ) in a process of its own:
    one line naming the output, no traceback, and nothing of the output left (GDAL's
    half-written GeoPackage was left beside it, and change said 'internal error')."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    noisy = rng.integers(1, 5, size=(600, 600)).astype(np.uint8)  # compresses badly
    before = write_map(tmp_path / "b.tif", noisy)
    after = write_map(tmp_path / "a.tif", np.roll(noisy, 1, axis=0))
    out = tmp_path / "out"
    if command == "change":
        args = ["change", str(before), str(after), "--out", str(out)]
    else:
        out.mkdir()
        target = out / f"s{command.split()[1]}"
        args = ["sample", str(before), "--out", str(target), "--size", "8000"]
    done = subprocess.run(
        [sys.executable, "-m", "landcover.cli.app", "-q", *args],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: _limited_to(64 * 1024),
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in errors[0], done.stderr
    assert str(out) in errors[0]
    assert not out.exists() or list(out.iterdir()) == []
