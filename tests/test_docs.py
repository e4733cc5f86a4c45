"""The documentation: the README's size, the generated CLI reference, the benchmark tables' result
files, and the commands of the README's tour and of the guides, which run here on tiny
synthetic data.

A code block runs when the line before its fence is `<!-- test: run -->`; every line of such a
block is a `landcover` command (continued with a trailing backslash), run in-process through
click. The README's tour runs in one temporary directory, block after block. Each guide
(docs/guide/*.md) runs in a directory of its own that starts with the files its commands read
(GUIDE_INPUTS, copied from one workspace built once by the CLI itself), its blocks in page
order. Every shell block of a guide is run, or says in its mark why it cannot run here
(`<!-- test: skip: REASON -->`: a real cluster, Azure, a network service). Counts that only
scale the work (epochs, trials) are made small (SMALLER). The site build itself
(`mkdocs build --strict`) is `make docs`, which CI runs before the suite.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from landcover.cli.app import COMMANDS, main
from landcover.cli.reference import render_cli_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"
GUIDES = DOCS / "guide"
RUN_MARK = "<!-- test: run -->"
SKIP_MARK = re.compile(r"^<!-- test: skip: (?P<reason>\S.*) -->$")
SHELL_FENCE = "```bash"
# files whose marked blocks run, in this order, in one directory (later blocks use earlier outputs)
RUN_ORDER = ["README.md"]
# What each guide's commands start from: entries of the guides' workspace (guide_workspace),
# each copied under its last name. Its one chip store holds enough train chips for the batches
# of 2 workers, the most that run here (SMALLER).
GUIDE_INPUTS: dict[str, tuple[str, ...]] = {
    "tile.md": ("naip", "chesapeake", "lc"),
    "train.md": ("chips.zarr",),
    "models.md": ("chips.zarr",),
    "cluster.md": ("chips.zarr", "cluster.json"),
    "scale.md": ("chips.zarr",),
    "tune.md": ("chips.zarr",),
    "predict.md": ("runs", "naip", "county.geojson"),
    "evaluate.md": ("lc.tif", "chesapeake"),
    "area-and-change.md": ("lc-2018", "lc-2022"),
    "view.md": ("lc.tif", "naip", "maps", "a.tif", "b.tif"),
    "export.md": ("runs", "naip"),
    "stac.md": ("naip", "chesapeake", "naip-search.json", "stac"),
}
# Counts that only scale the work, as a page gives them and as they run here (each is used):
# epochs, trials, and workers (2 on this 2-core machine run the same code as 4).
SMALLER = {
    "--nproc 4": "--nproc 2",
    "--workers 1,2,4": "--workers 1,2",
    "--epochs 20": "--epochs 1",
    "--epochs 10": "--epochs 1",
    "--epochs 5": "--epochs 1",
    "--epochs 3": "--epochs 1",
    "--trials 20": "--trials 2",
    "--trials 8": "--trials 2",
}
RESULTS_MARKER = re.compile(r"^<!-- results: (?P<file>[\w.-]+)#(?P<table>[\w-]+) -->$", re.M)

sys.path.insert(0, str(REPO / "benchmarks"))
from resultfile import (  # noqa: E402
    ResultFile,
    ResultTable,
    read_result_file,
    recording_tables,
    table_markdown,
    write_result_file,
)


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def block_commands(lines: list[str]) -> list[str]:
    """The commands of a code block's lines: continuations joined, comment lines left out."""
    joined = "\n".join(lines).replace("\\\n", " ")
    return [c for c in joined.splitlines() if c.strip() and not c.startswith("#")]


def marked_blocks(text: str) -> list[list[str]]:
    """The commands of each code block that follows a RUN_MARK line, continuations joined."""
    blocks = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != RUN_MARK:
            continue
        assert lines[i + 1].startswith("```"), f"{RUN_MARK} must precede a code fence"
        end = lines.index("```", i + 2)
        blocks.append(block_commands(lines[i + 2 : end]))
    return blocks


def shell_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Every shell code block of a page: the line before its fence (its mark, or not) and its
    commands."""
    lines = text.splitlines()
    return [
        (
            lines[i - 1].strip() if i else "",
            block_commands(lines[i + 1 : lines.index("```", i + 1)]),
        )
        for i, line in enumerate(lines)
        if line.strip() == SHELL_FENCE
    ]


def test_the_readme_is_a_short_guide_that_links_into_the_site() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    for heading in ("## Install", "## A five-minute tour", "## State recipe", "## Engines"):
        assert heading in readme
    assert "make demo" in readme and "make test" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), f"README links {link}, which does not exist"


def test_the_tour_says_how_landcover_gets_on_the_path_before_its_first_command() -> None:
    """`make demo` leaves `landcover` in .venv/bin, which a new shell does not search: the
    README and the getting-started page (which includes the tour) say so before the first
    command a reader types."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tour = readme[readme.index("[start:tour]") :]
    assert "source .venv/bin/activate" in tour[: tour.index(RUN_MARK)]
    install = readme[readme.index("## Install") : readme.index("## A five-minute tour")]
    assert "source .venv/bin/activate" in install and ".venv/bin/landcover" in install
    started = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert "source .venv/bin/activate" in started and ".venv/bin/landcover" in started
    assert '--8<-- "README.md:tour"' in started


# What a user page may not carry: a path outside the repository, an issue number, or "this
# machine" meaning the one the page was written on (the changelog records history and may).
OUTSIDE = re.compile(r"\.\./shared|/work/|\b[Ii]ssue #?\d+|(?<![\w&])#\d+\b|\b[Tt]his machine\b")


def test_user_pages_point_nowhere_outside_the_repository_and_name_no_issue() -> None:
    pages = [p for p in markdown_files() if p.name != "changelog.md"]
    assert REPO / "docs" / "CONTRACTS.md" in pages
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in pages
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []
    assert OUTSIDE.search("see issue 34") and OUTSIDE.search("`../shared/DESIGN.md`")
    assert OUTSIDE.search("measured on this machine")


def test_every_command_and_subcommand_is_in_the_cli_reference() -> None:
    page = render_cli_reference(main, prog_name="landcover")
    headings = set(re.findall(r"^## (.+)$", page, re.M))
    runner = CliRunner()
    expected = []
    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        expected.append([name])
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=name)
            expected += [[name, sub] for sub in command.list_commands(ctx)]
    assert any(len(path) == 2 for path in expected)  # the groups' subcommands are walked too
    for path in expected:
        assert "landcover " + " ".join(path) in headings
        shown = runner.invoke(
            main,
            [*path, "--help"],
            prog_name="landcover",
            terminal_width=100,
            max_content_width=100,
        )
        assert shown.exit_code == 0, shown.output
        assert shown.output.rstrip() in page, f"landcover {' '.join(path)} --help differs"


def test_every_results_marker_names_a_table_of_a_result_file() -> None:
    markers = [
        (path, m["file"], m["table"])
        for path in markdown_files()
        for m in RESULTS_MARKER.finditer(path.read_text(encoding="utf-8"))
    ]
    assert markers
    for path, file_name, table_name in markers:
        result = read_result_file(RESULTS / f"{file_name}.json")
        table = result.table(table_name)
        assert table.rows, f"{path}: {file_name}#{table_name} has no rows"
        assert all(len(row) == len(table.columns) for row in table.rows)
        assert result.machine and result.date and result.command
    for result_path in RESULTS.glob("*.json"):
        assert read_result_file(result_path).provenance in ("run", "transcribed")


def test_a_result_file_round_trips_and_renders_as_a_markdown_table(tmp_path: Path) -> None:
    table = ResultTable(
        name="t", title="T", columns=["mode", "s"], rows=[["a|b", 1.5], ["c", None]]
    )
    result = ResultFile(
        benchmark="bench_x.py", command="python x", machine="m", date="2026-01-01", tables=[table]
    )
    write_result_file(tmp_path / "x.json", result)
    assert read_result_file(tmp_path / "x.json") == result
    assert table_markdown(table).splitlines() == [
        "| mode | s |",
        "|---|---:|",
        "| a\\|b | 1.5 |",
        "| c |  |",
    ]
    with pytest.raises(KeyError, match="no table 'u'"):
        result.table("u")


def test_json_writes_the_tables_a_benchmark_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    argv = ["bench_x.py", "--quick", "--json", str(out)]
    with recording_tables("bench_x.py", argv):
        print("# bench_x on 2 cores\n\n## Tiling, 2 workers\n")
        print("| method | s |\n|---|---:|\n| ours | 1.5 |\n| limit | 1.2 |\n\nratio 0.8")
    assert argv == ["bench_x.py", "--quick"]  # the script's own parser never sees --json
    assert "| ours | 1.5 |" in capsys.readouterr().out
    result = read_result_file(out)
    assert (result.provenance, result.conditions) == ("run", "bench_x on 2 cores")
    assert result.command == "python benchmarks/bench_x.py --quick"
    table = result.table("tiling_2_workers")
    assert (table.columns, table.rows) == (["method", "s"], [["ours", "1.5"], ["limit", "1.2"]])
    assert table.align == ["left", "right"]

    failed = tmp_path / "failed.json"
    with pytest.raises(SystemExit), recording_tables("bench_x.py", ["x", "--json", str(failed)]):
        sys.exit(1)
    assert not failed.exists()


def test_only_the_tour_and_the_guides_in_guide_inputs_have_runnable_blocks() -> None:
    holders = [
        p.relative_to(REPO).as_posix() for p in markdown_files() if RUN_MARK in p.read_text()
    ]
    assert sorted(holders) == sorted([*RUN_ORDER, *(f"docs/guide/{g}" for g in GUIDE_INPUTS)])


def test_every_shell_block_of_a_guide_runs_here_or_says_why_not() -> None:
    """A guide's shell block is marked to run, or to be skipped with its reason on the mark's
    line; a new block without a mark fails here, so no command a reader types goes untried."""
    unmarked = [
        f"{page.name}: {commands[0] if commands else '(empty block)'}"
        for page in sorted(GUIDES.glob("*.md"))
        for mark, commands in shell_blocks(page.read_text(encoding="utf-8"))
        if mark != RUN_MARK and not SKIP_MARK.match(mark)
    ]
    assert unmarked == []
    assert SKIP_MARK.match("<!-- test: skip: needs a SLURM cluster -->")
    assert not SKIP_MARK.match("<!-- test: skip: -->")  # a skip names its reason
    assert shell_blocks("x\n```bash\nlandcover a \\\n  --b\n# c\n```\n") == [
        ("x", ["landcover a    --b"])
    ]


def run_command(command: str) -> None:
    """Run one `landcover` line of a page in this process, in the current directory; it must
    exit 0."""
    argv = shlex.split(command, comments=True)
    assert argv[0] == "landcover", f"a runnable block holds a non-landcover line: {command}"
    result = CliRunner().invoke(main, argv[1:])
    assert result.exit_code == 0, f"{command}\n{result.output}"


@pytest.mark.slow
def test_the_runnable_blocks_run_on_synthetic_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each marked command exits 0, in order, in one directory; the tour ends with a map and
    its scores."""
    monkeypatch.chdir(tmp_path)
    commands = [
        command
        for name in RUN_ORDER
        for block in marked_blocks((REPO / name).read_text(encoding="utf-8"))
        for command in block
    ]
    assert commands
    for command in commands:
        run_command(command)
    assert (tmp_path / "lc.tif").is_file()
    assert (tmp_path / "eval" / "metrics.json").is_file()


# -- the guides ---------------------------------------------------------------------------------


def invoke(*argv: str | Path) -> None:
    result = CliRunner().invoke(main, [str(a) for a in argv])
    assert result.exit_code == 0, f"landcover {shlex.join(map(str, argv))}\n{result.output}"


def region_inside(image: Path) -> dict[str, object]:
    """A GeoJSON polygon (lon/lat) over the middle of `image`'s footprint."""
    import rasterio
    from rasterio.warp import transform_bounds

    with rasterio.open(image) as ds:
        west, south, east, north = transform_bounds(ds.crs, "EPSG:4326", *ds.bounds)
    dx, dy = (east - west) / 4, (north - south) / 4
    ring = [
        [west + dx, south + dy], [east - dx, south + dy], [east - dx, north - dy],
        [west + dx, north - dy], [west + dx, south + dy],
    ]  # fmt: skip
    polygon = {"type": "Polygon", "coordinates": [ring]}
    return {"type": "Feature", "properties": {}, "geometry": polygon}


@pytest.fixture(scope="module")
def guide_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every file the guides' commands read, under the names they use, made once by the CLI:
    two small synthetic scenes (naip/, their labels as chesapeake/ and lc/) and their chip
    store (enough train chips for 2 workers' batches of 16), a model trained one epoch
    (runs/a), its map as one COG (lc.tif, a.tif, b.tif) and as tiled products (lc-2018/,
    lc-2022/, maps/va-2021/), a region, a saved STAC search, a static STAC catalog and the
    repository's cluster.json."""
    from tests.tiling.stacfiles import raster_item, write_catalog, write_item_collection

    root = tmp_path_factory.mktemp("guide-inputs")
    invoke("synth", root, "--scenes", "2", "--size", "300", "--seed", "0")
    (root / "labels").rename(root / "chesapeake")
    shutil.copytree(root / "chesapeake", root / "lc")
    images = sorted((root / "naip").glob("*.tif"))
    chips, model = root / "chips.zarr", root / "runs" / "a" / "model.pt"
    invoke("tile", f"{root}/naip/*.tif", "--labels", f"{root}/chesapeake/*.tif", "--out", chips,
           "--chip-size", "64", "--shard-size", "8", "--val-fraction", "0.2")  # fmt: skip
    invoke("train", chips, "--out", model.parent, "--epochs", "1", "--batch-size", "16")
    invoke("predict", model, f"{root}/naip/*.tif", "--out", root / "lc.tif")
    invoke("predict", model, f"{root}/naip/*.tif", "--out", f"{root / 'lc-2018'}/",
           "--tile-size", "256")  # fmt: skip
    for product in (root / "lc-2022", root / "maps" / "va-2021"):
        shutil.copytree(root / "lc-2018", product)  # a moved product is a product
    for copy in ("a.tif", "b.tif"):
        shutil.copy2(root / "lc.tif", root / copy)
    (root / "county.geojson").write_text(json.dumps(region_inside(images[0])))
    items = [raster_item(tif, item_id=tif.stem, year=2018) for tif in images]
    write_item_collection(items, root / "naip-search.json")
    write_catalog(items, root / "stac")
    shutil.copy2(REPO / "cluster.json", root / "cluster.json")
    assert all((root / name).exists() for names in GUIDE_INPUTS.values() for name in names)
    return root


def label_the_sample(work: Path) -> None:
    """What the reader of "Area and change" does in QGIS between sampling and estimating: type
    a class into each point's `reference` (here the map's own class)."""
    import pyogrio.raw  # type: ignore[import-untyped]

    sample = work / "sample.gpkg"
    meta, _, geometry, data = pyogrio.raw.read(sample)
    fields = list(meta["fields"])
    data[fields.index("reference")] = data[fields.index("map_class")]
    sample.unlink()
    pyogrio.raw.write(sample, geometry, data, fields=fields, crs=meta["crs"], driver="GPKG",
                      geometry_type="Point")  # fmt: skip


# What a reader does by hand after a guide's block (by its index among the guide's runnable
# blocks), before the next one.
BY_HAND: dict[str, dict[int, Callable[[Path], None]]] = {
    "area-and-change.md": {0: label_the_sample},
}


def smaller(command: str) -> str:
    """`command` with the counts of SMALLER made small (whole words only)."""
    for given, small in SMALLER.items():
        command = re.sub(rf"(?<!\S){re.escape(given)}(?!\S)", small, command)
    return command


def guide_commands(guide: str) -> list[list[str]]:
    return marked_blocks((GUIDES / guide).read_text(encoding="utf-8"))


def test_every_smaller_count_is_one_a_guide_gives() -> None:
    commands = " ".join(c for guide in GUIDE_INPUTS for b in guide_commands(guide) for c in b)
    assert [given for given in SMALLER if given not in commands] == []
    assert smaller("tune s --trials 20 --epochs 5") == "tune s --trials 2 --epochs 1"
    assert smaller("train s --epochs 200") == "train s --epochs 200"
    assert smaller("train s --nproc 4 --epochs 3") == "train s --nproc 2 --epochs 1"


@pytest.mark.slow
@pytest.mark.parametrize("guide", sorted(GUIDE_INPUTS))
def test_a_guides_commands_run_on_synthetic_data(
    guide: str, guide_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide's runnable blocks, in page order, in a directory holding only the files they
    read: every command exits 0."""
    for name in GUIDE_INPUTS[guide]:
        source = guide_workspace / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / source.name)
        else:
            shutil.copy2(source, tmp_path / source.name)
    monkeypatch.chdir(tmp_path)
    blocks = guide_commands(guide)
    assert blocks and all(blocks)
    for index, block in enumerate(blocks):
        for command in block:
            run_command(smaller(command))
        by_hand = BY_HAND.get(guide, {}).get(index)
        if by_hand is not None:
            by_hand(tmp_path)
