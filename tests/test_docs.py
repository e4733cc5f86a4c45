"""The documentation: the README's size, the generated CLI reference, the benchmark tables' result
files, and the guides' runnable code blocks, which run here on tiny synthetic data.

A code block runs when the line before its fence is `<!-- test: run -->`; every line of such a
block is a `landcover` command (continued with a trailing backslash), run in-process through
click in one temporary directory, block after block in the order of RUN_ORDER. The site build
itself (`mkdocs build --strict`) is `make docs`, which CI runs before the suite.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from landcover.cli.app import COMMANDS, main
from landcover.cli.reference import render_cli_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"
RUN_MARK = "<!-- test: run -->"
# files whose marked blocks run, in this order, in one directory (later blocks use earlier outputs)
RUN_ORDER = ["README.md"]
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


def marked_blocks(text: str) -> list[list[str]]:
    """The commands of each code block that follows a RUN_MARK line, continuations joined."""
    blocks = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != RUN_MARK:
            continue
        assert lines[i + 1].startswith("```"), f"{RUN_MARK} must precede a code fence"
        end = lines.index("```", i + 2)
        joined = "\n".join(lines[i + 2 : end]).replace("\\\n", " ")
        blocks.append([c for c in joined.splitlines() if c.strip() and not c.startswith("#")])
    return blocks


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


def test_only_the_files_in_run_order_have_runnable_blocks() -> None:
    holders = [
        p.relative_to(REPO).as_posix() for p in markdown_files() if RUN_MARK in p.read_text()
    ]
    assert sorted(holders) == sorted(RUN_ORDER)


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
    runner = CliRunner()
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "landcover", f"a runnable block holds a non-landcover line: {command}"
        result = runner.invoke(main, argv[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
    assert (tmp_path / "lc.tif").is_file()
    assert (tmp_path / "eval" / "metrics.json").is_file()
