"""User strings are data, never markup, in every document the project writes (issue 41).

One test per writer of HTML, Markdown or matplotlib figures: `view`'s page, `evaluate`'s
report.html, metrics.md, printed table and pictures, the scaling report's pages and figures,
`predict`'s quicklook and `tune`'s trials.md and trials.png. Each gets hostile file, directory,
class, device, run, parameter and title names and must show them as written: the HTML parsed
has no element, attribute or script from a name, the JSON in the view page has no `<` (so
neither `</script>` nor `<!--`), the Markdown rendered (Python-Markdown, as MkDocs renders it)
has no link, image, HTML or broken table row from a name, and no figure text is mathtext, TeX,
or a legend entry hidden by a leading `_`.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import markdown  # type: ignore[import-untyped]  # MkDocs's renderer (dev extra)
import matplotlib
import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib import cbook
from matplotlib.figure import Figure
from matplotlib.text import Text

from landcover.cli.app import main
from landcover.markup import markdown_text, plot_text, script_json, terminal_text
from landcover.scaling.report import write_scaling_report
from landcover.scaling.runs import load_runs
from landcover.tuning.results import TrialRow, write_results
from landcover.view import open_map, quicklook_png
from tests.landcover.evaluation.maps import write as write_raster
from tests.landcover.scaling.runfiles import write_run
from tests.landcover.view.maps import (
    FIVE,
    RES_M,
    X0,
    Y0,
    class_blocks,
    write_map,
    write_mosaic,
)
from tiling.sources.classes import ClassInfo, ClassMap

HOSTILE = (
    "<img src=x onerror=alert(1)>",
    "<!--<script>",
    "</script><script>alert(1)</script>",
    "$x^2$",
    "$\\notacommand$",
    "|pipe| cell",
    "_under *star* [link](http://e.invalid) `code` ~~s~~ &lt; #h",
)
SIZE = 64


VIEW_ELEMENTS = {
    *("html", "head", "meta", "title", "style", "body", "div", "aside", "h1", "h2", "p"),
    *("label", "input", "span", "section", "table", "thead", "tbody", "tfoot", "tr", "th"),
    *("td", "script"),
}


def file_name(name: str) -> str:
    """`name` as a file name: all of it but the slash a file name cannot hold."""
    return name.replace("/", "-")


def hostile_classes(name: str) -> ClassMap:
    """The five-class table with every class named after `name`."""
    classes = [FIVE.classes[0]] + [
        ClassInfo(c.code, f"{name} {c.code}", c.color) for c in FIVE.classes[1:]
    ]
    return ClassMap(FIVE.name, tuple(classes), FIVE.raw_to_code)


# --- reading the outputs ---------------------------------------------------------------------


class ParsedHtml(HTMLParser):
    """Every start tag with its attributes, the text, and each script's content."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            attrs, content = self.scripts[-1]
            self.scripts[-1] = (attrs, content + data)
        else:
            self.text.append(data)

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"a comment in the page: <!--{data[:60]}")


def parse_html(page: str, *, allowed: set[str], linked: bool = False) -> ParsedHtml:
    """The page parsed: only `allowed` elements, no event handler attribute, images only
    embedded (or, `linked`, files of the report beside it)."""
    parsed = ParsedHtml()
    parsed.feed(page)
    parsed.close()
    for tag, attrs in parsed.tags:
        assert tag in allowed, (tag, attrs)
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        if tag == "img":
            src = str(attrs.get("src", ""))
            file = linked and re.fullmatch(r"[a-z0-9-]+\.png", src)
            assert src.startswith("data:image/") or file, attrs
    return parsed


def unescaped(text: str) -> str:
    """Rendered Markdown's text as CommonMark shows it: a backslash before ASCII punctuation
    (an escape Python-Markdown leaves for $, ~ and |) is not shown."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)


def check_markdown(text: str, names: list[str], *, images: int = 0) -> None:
    """`text` rendered as MkDocs does: names are text, tables keep their columns."""
    page = markdown.markdown(text, extensions=["tables"])
    allowed = {"h1", "h2", "h3", "p", "br", "table", "thead", "tbody", "tr", "th", "td", "ul", "li"}
    parsed = parse_html(page, allowed=allowed | ({"img"} if images else set()), linked=True)
    assert sum(1 for tag, _ in parsed.tags if tag == "img") == images
    shown = unescaped("".join(parsed.text))
    for name in names:
        assert name in shown, (name, shown[:300])
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        widths = {
            len(re.findall(r"<t[hd][ >]", row))
            for row in re.findall(r"<tr>.*?</tr>", table, flags=re.S)
        }
        assert len(widths) == 1, table[:300]


@pytest.fixture
def figure_texts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool, bool]]]:
    """(text shown, mathtext?, TeX?) of every text of every figure saved; the user's
    matplotlibrc asks for TeX (not installed here), which no figure may use."""
    texts: list[tuple[str, bool, bool]] = []
    save = Figure.savefig

    def spy(fig: Figure, *args: Any, **kwargs: Any) -> Any:
        for text in fig.findobj(Text):
            raw = text.get_text()
            math = cbook.is_math_text(raw)
            texts.append((raw if math else raw.replace("\\$", "$"), math, text.get_usetex()))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    yield texts


def check_figures(texts: list[tuple[str, bool, bool]], names: list[str]) -> None:
    assert texts, "no figure was saved"
    assert [t for t in texts if t[1] or t[2]] == []
    legends = [shown for shown, _, _ in texts]
    for name in names:
        assert any(name in shown for shown in legends), name


# --- the writers -----------------------------------------------------------------------------


def view_page(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """A COG and a tiled product named `name`, classes named after it, titled `name`."""
    classes = hostile_classes(name)
    codes = class_blocks(SIZE, SIZE, seed=1)
    folder = tmp_path / file_name(name)
    folder.mkdir()
    cog = write_map(folder / f"{file_name(name)}.tif", codes, class_map=classes)
    product = tmp_path / f"{file_name(name)} product"
    product.mkdir()
    tiles = [
        write_map(product / "tile_0_0.tif", codes, class_map=classes, x0=X0 + SIZE * RES_M),
        write_map(product / "tile_0_1.tif", codes, class_map=classes, x0=X0 + 2 * SIZE * RES_M),
    ]
    write_mosaic(product, tiles, SIZE, SIZE)
    page = tmp_path / "page.html"
    result = CliRunner().invoke(
        main, ["view", str(cog), str(product), "--out", str(page), "--title", name]
    )
    assert result.exit_code == 0, result.output
    allowed = VIEW_ELEMENTS
    parsed = parse_html(page.read_text(encoding="utf-8"), allowed=allowed)
    assert len(parsed.scripts) == 3  # the data, Leaflet, the page's own
    (attrs, payload), *_ = parsed.scripts
    assert attrs == {"id": "view-data", "type": "application/json"}
    assert "<" not in payload and "\u2028" not in payload
    data = json.loads(payload)
    assert data["maps"] == [cog.name, product.name]
    shown = "".join(parsed.text)
    for expected in (name, cog.name, product.name, f"{name} 1"):
        assert expected in shown, expected


def evaluate_report(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """A prediction and a truth scene named `name`, classes named after it: report.html,
    metrics.md, the printed table, the confusion matrix, the class table and the panel."""
    codes = class_blocks(SIZE, SIZE, seed=2)
    prediction = write_map(
        tmp_path / f"{file_name(name)}.tif", codes, class_map=hostile_classes(name)
    )
    raw = np.repeat(np.repeat(codes, 2, axis=0), 2, axis=1)
    raw = np.where(raw == 4, 5, np.where(raw == 0, 15, raw)).astype(np.uint8)
    truth = write_raster(tmp_path / f"{file_name(name)} truth.tif", raw, x0=X0, y0=Y0)
    out = tmp_path / "report"
    result = CliRunner().invoke(
        # a truth named with [, * or ? is found only as a glob of its escaped name
        main,
        ["evaluate", str(prediction), "--truth", glob.escape(str(truth)), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert (out / "panel-01.png").is_file()
    class_names = [f"{name} {c}" for c in range(1, 5)]
    check_markdown(
        (out / "metrics.md").read_text(encoding="utf-8"),
        [prediction.name, truth.name, *class_names],
    )
    check_markdown(result.stdout, class_names)
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "table",
               "thead", "tbody", "tr", "th", "td", "span", "figure", "img",
               "figcaption"}  # fmt: skip
    parsed = parse_html((out / "report.html").read_text(encoding="utf-8"), allowed=allowed)
    assert parsed.scripts == []
    shown = "".join(parsed.text)
    for expected in (prediction.name, truth.name, *class_names):
        assert expected in shown, expected
    captions = [a.get("alt") for tag, a in parsed.tags if tag == "img"]
    assert truth.name in captions
    check_figures(texts, [*class_names, truth.name])


def scaling_report(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """Runs on a device named `name`, in run directories named after it."""
    root = tmp_path / "runs"
    for workers in (1, 2):
        write_run(
            root, f"{file_name(name)} {workers}", workers=workers,
            epoch_times=[30.0 / workers, 10.0 / workers, 10.0 / workers], device=name,
        )  # fmt: skip
    paths = write_scaling_report(load_runs([root]), tmp_path / "report")
    run = str(root / f"{file_name(name)} 1")
    check_markdown(
        paths.markdown.read_text(encoding="utf-8"), [name, run], images=len(paths.images)
    )
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table",
               "thead", "tbody", "tr", "th", "td", "img", "ul", "li"}  # fmt: skip
    parsed = parse_html(paths.html.read_text(encoding="utf-8"), allowed=allowed)
    assert parsed.scripts == []
    shown = "".join(parsed.text)
    assert name in shown and run in shown
    check_figures(texts, [name])


def quicklook(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """The quicklook of a map named `name` whose classes are named after it."""
    lc = write_map(
        tmp_path / f"{file_name(name)}.tif",
        class_blocks(SIZE, SIZE, seed=3),
        class_map=hostile_classes(name),
    )
    quicklook_png(open_map(str(lc)))
    check_figures(texts, [lc.name, f"{name} 1"])


def tune_table(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """trials.md of a search over a parameter whose value is `name`."""
    row = TrialRow(0, {"model": name, "lr": 0.01}, 0.5, 3, "complete", "trial-000")
    table, _ = write_results(tmp_path, [row])
    check_markdown(table.read_text(encoding="utf-8"), [f"model={name}"])


def change_report(tmp_path: Path, name: str, texts: list[Any]) -> None:
    """`landcover change` between two maps named after `name` whose classes are named after
    it (change.md, change.png, the printed table), then `landcover view` of the change."""
    before_codes = class_blocks(SIZE, SIZE, seed=4)
    after_codes = np.where(before_codes == 1, 2, before_codes).astype(np.uint8)
    classes = hostile_classes(name)
    before = write_map(tmp_path / f"{file_name(name)} a.tif", before_codes, class_map=classes)
    after = write_map(tmp_path / f"{file_name(name)} b.tif", after_codes, class_map=classes)
    out = tmp_path / "change"
    result = CliRunner().invoke(main, ["change", str(before), str(after), "--out", str(out)])
    assert result.exit_code == 0, result.output
    pair = f"{name} 1→{name} 2"
    check_markdown((out / "change.md").read_text(encoding="utf-8"), [before.name, f"{name} 1"])
    check_markdown(result.stdout, [f"{name} 1"])
    check_figures(texts, [f"{name} 1"])
    page = tmp_path / "change.html"
    result = CliRunner().invoke(main, ["view", str(out), "--out", str(page)])
    assert result.exit_code == 0, result.output
    parsed = parse_html(page.read_text(encoding="utf-8"), allowed=VIEW_ELEMENTS)
    assert len(parsed.scripts) == 3
    assert "<" not in parsed.scripts[0][1]
    assert pair in "".join(parsed.text)


WRITERS: dict[str, Callable[[Path, str, list[Any]], None]] = {
    "change report": change_report,
    "view page": view_page,
    "evaluate report": evaluate_report,
    "scaling report": scaling_report,
    "predict quicklook": quicklook,
    "tune table": tune_table,
}


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_names_are_text_in_every_document(
    writer: str, name: str, tmp_path: Path, figure_texts: list[tuple[str, bool, bool]]
) -> None:
    WRITERS[writer](tmp_path, name, figure_texts)


# --- the escapes themselves ------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE)
def test_script_json_round_trips_without_markup_characters(name: str) -> None:
    text = script_json({"name": name, "separators": "\u2028\u2029"})
    assert not set(text) & set("<>&\u2028\u2029")
    assert json.loads(text) == {"name": name, "separators": "\u2028\u2029"}


@pytest.mark.parametrize(
    ("text", "line_start", "expected"),
    [
        ("1.00", False, "1.00"),  # a number in a table cell stays as it is
        ("1. a", True, "1\\. a"),  # not a list at the start of a paragraph
        ("- a", True, "\\- a"),
        ("w8_fp16", False, "w8_fp16"),  # inside a word, _ is no emphasis
        ("a & b", False, "a & b"),
        ("&amp;", False, "&amp;amp;"),
        ("two\nlines", False, "two lines"),
    ],
)
def test_markdown_text_escapes_only_what_would_act(
    text: str, line_start: bool, expected: str
) -> None:
    assert markdown_text(text, line_start=line_start) == expected


def test_plot_text_keeps_dollars_and_underscores_visible() -> None:
    assert plot_text("$x^2$") == "\\$x^2\\$"
    assert plot_text("_water") == " _water"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # no escape sequence reaches the terminal
        ("two\nlines\rback\ttab", "two\\nlines\\rback\\ttab"),
        ("rtl\u202egpj.tif", "rtl\\u202egpj.tif"),  # no reordering of what follows
        ("zero\u200bwidth\u2028sep\xa0", "zero\\u200bwidth\\u2028sep\\xa0"),
        ("plain é 中 [x] $y$ <b>", "plain é 中 [x] $y$ <b>"),  # printable text stays
    ],
)
def test_terminal_text_escapes_only_what_a_terminal_acts_on(text: str, expected: str) -> None:
    assert terminal_text(text) == expected
    assert terminal_text(text).isprintable()
