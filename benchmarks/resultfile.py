"""Result files of the benchmarks: the tables a benchmark printed, with the command, machine and
date that produced them, as JSON in `benchmarks/results/`. The documentation site's benchmark
pages render their tables from these files (`docs/hooks/generate.py`).

Every benchmark script takes `--json PATH`: its `__main__` block runs under
`recording_tables`, which copies what the script prints and, when it ends without an error,
writes the Markdown tables it printed (each named after the heading above it) to PATH. The
site reads them with `read_result_file` and renders a table with `table_markdown`.
`provenance` says whether the file was written by a run of the script ("run") or
transcribed from the tables the script printed in an earlier run ("transcribed"), so a
reader knows which numbers a script wrote.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

FORMAT_VERSION = 1
PROVENANCES = ("run", "transcribed")

Cell = str | int | float | None


@dataclass(frozen=True)
class ResultTable:
    """One printed table: `name` is its key within the file (`docs` pages refer to
    `FILE#name`), `columns` its header, `rows` its cells as the benchmark formats them,
    `align` "left" or "right" per column (empty: numbers right, text left)."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str = ""
    align: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ResultFile:
    """What one benchmark run printed: its tables and the conditions they were taken in."""

    benchmark: str
    command: str
    machine: str
    date: str
    tables: list[ResultTable]
    provenance: str = "run"
    conditions: str = ""
    version: int = FORMAT_VERSION
    extra: dict[str, object] = field(default_factory=dict)

    def table(self, name: str) -> ResultTable:
        """The table called `name`; KeyError naming the tables there when none is."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(
            f"{self.benchmark}: no table {name!r}; it has {[t.name for t in self.tables]}"
        )


def this_machine() -> str:
    """A one-line description of the machine a run is on: CPU model, cores, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def today() -> str:
    """Today's date (UTC) as YYYY-MM-DD, the `date` of a result file written now."""
    return datetime.now(UTC).date().isoformat()


def write_result_file(path: str | os.PathLike[str], result: ResultFile) -> None:
    """Write `result` as JSON at `path` atomically (a temp file beside it, then a rename)."""
    if result.provenance not in PROVENANCES:
        raise ValueError(f"provenance {result.provenance!r}: expected one of {PROVENANCES}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(asdict(result), indent=1, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_result_file(path: str | os.PathLike[str]) -> ResultFile:
    """Read a result file; ValueError naming the file on another format version."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if raw.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: result file version {raw.get('version')!r}, expected 1")
    tables = [ResultTable(**table) for table in raw.pop("tables")]
    return ResultFile(tables=tables, **raw)


def _cell_text(cell: Cell) -> str:
    if cell is None:
        return ""
    return str(cell).replace("|", "\\|")


def table_markdown(table: ResultTable) -> str:
    """`table` as a Markdown table, aligned as `table.align` says (else: columns whose cells
    are all numbers right, the others left)."""
    numeric = [
        table.align[i] == "right"
        if table.align
        else all(isinstance(row[i], int | float) or row[i] is None for row in table.rows)
        for i in range(len(table.columns))
    ]
    header = "| " + " | ".join(_cell_text(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if n else "---" for n in numeric) + "|"
    body = ["| " + " | ".join(_cell_text(c) for c in row) + " |" for row in table.rows]
    return "\n".join([header, rule, *body])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "table"


def _cells(line: str) -> list[str]:
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _row(cells: list[str]) -> list[Cell]:
    return list(cells)


def tables_from_markdown(text: str) -> list[ResultTable]:
    """Every Markdown table in `text` (a header row, a `|---|---:|` rule, then rows), named
    after the nearest `#` heading above it (`table`, `table_2`, ... without one; a repeated
    name gets a suffix), its alignment taken from the rule."""
    tables: list[ResultTable] = []
    lines = text.splitlines()
    heading = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        is_rule = i + 1 < len(lines) and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())
        if line.startswith("|") and is_rule:
            rule = _cells(lines[i + 1])
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(_row(_cells(lines[j])))
                j += 1
            name = _slug(heading)
            taken = {t.name for t in tables}
            unique, k = name, 2
            while unique in taken:
                unique, k = f"{name}_{k}", k + 1
            tables.append(
                ResultTable(
                    name=unique,
                    title=heading or unique,
                    columns=_cells(line),
                    rows=rows,
                    align=["right" if r.endswith(":") else "left" for r in rule],
                )
            )
            i = j
            continue
        i += 1
    return tables


class _Tee(io.TextIOBase):
    """Writes to `stream` and keeps a copy."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def recording_tables(benchmark: str, argv: list[str] | None = None) -> Iterator[None]:
    """Take `--json PATH` out of `argv` (default `sys.argv`, before the script parses it) and,
    when given, copy stdout while the block runs; if the block ends without an error (or with
    `sys.exit(0)`), write the tables printed to PATH as a result file of `benchmark`, with all
    it printed in `extra["printed"]`."""
    argv = sys.argv if argv is None else argv
    command = "python benchmarks/" + " ".join([benchmark, *map(shlex.quote, argv[1:])])
    path = None
    if "--json" in argv:
        at = argv.index("--json")
        if at + 1 >= len(argv):
            raise SystemExit("--json needs a PATH")
        path = argv[at + 1]
        del argv[at : at + 2]
        command = command.replace(f" --json {shlex.quote(path)}", "")
    if path is None:
        yield
        return
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        _write_recorded(path, benchmark, command, tee.copy.getvalue())
        raise
    finally:
        sys.stdout = tee.stream
    _write_recorded(path, benchmark, command, tee.copy.getvalue())


def _write_recorded(path: str, benchmark: str, command: str, printed: str) -> None:
    titles = [line.lstrip("#").strip() for line in printed.splitlines() if line.startswith("# ")]
    result = ResultFile(
        benchmark=benchmark,
        command=command,
        machine=this_machine(),
        date=today(),
        tables=tables_from_markdown(printed),
        conditions=titles[0] if titles else "",
        extra={"printed": printed},
    )
    write_result_file(path, result)
