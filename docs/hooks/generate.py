"""MkDocs hook: the generated parts of the site.

- `reference/cli.md`: every `landcover` command and subcommand with its `--help` text
  (`landcover.cli.reference`), built from the click group at build time.
- Benchmark tables: a line `<!-- results: FILE#TABLE -->` in a page becomes the table TABLE of
  `benchmarks/results/FILE.json` (`benchmarks/resultfile.py`) with the command, machine and date
  that produced it. A marker naming a missing file or table fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
CLI_REFERENCE = "reference/cli.md"
MARKER = re.compile(r"^<!-- results: (?P<file>[\w.-]+)#(?P<table>[\w-]+) -->$", re.MULTILINE)

if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

from resultfile import read_result_file, table_markdown  # noqa: E402


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    """Add the CLI reference page, rendered from the click group."""
    from landcover.cli.app import main
    from landcover.cli.reference import render_cli_reference

    content = render_cli_reference(main, prog_name="landcover")
    files.append(File.generated(config, CLI_REFERENCE, content=content))
    return files


def results_markdown(file_name: str, table_name: str) -> str:
    """Table `table_name` of `benchmarks/results/<file_name>.json` with a caption saying
    which command, machine and date produced it."""
    path = RESULTS / f"{file_name}.json"
    if not path.is_file():
        raise PluginError(f"results marker: {path} does not exist")
    result = read_result_file(path)
    try:
        table = result.table(table_name)
    except KeyError as exc:
        raise PluginError(str(exc.args[0])) from None
    source = (
        "written by the run"
        if result.provenance == "run"
        else "transcribed from the script's printed tables"
    )
    caption = (
        f"*{table.title}*: `{result.command}`; {result.machine}; {result.date}"
        f" (`benchmarks/results/{file_name}.json`, {source})."
    )
    parts = [caption, ""]
    if result.conditions:
        parts[0] += f" Conditions: {result.conditions}."
    if table.note:
        parts[0] += f" {table.note}."
    parts.append(table_markdown(table))
    return "\n".join(parts)


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, **_: Any) -> str:
    """Replace each results marker in the page with its table."""
    return MARKER.sub(lambda m: results_markdown(m["file"], m["table"]), markdown)
