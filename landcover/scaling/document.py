"""The scaling report as a document: headings, paragraphs, tables, images and bullets rendered
to Markdown or to self-contained HTML (images embedded), and the number formats its tables and
figures share. Every text (headings, paragraphs, cells, list items, image captions) is plain
text in both renderings: escaped for HTML, and for Markdown (`landcover.markup`), so device,
store and run names show as written and never as markup.
"""

from __future__ import annotations

import base64
import math
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from landcover.markup import html_text, markdown_text

__all__ = [
    "Block",
    "Bullets",
    "Heading",
    "Image",
    "Paragraph",
    "Table",
    "format_bytes",
    "format_seconds",
    "render_html",
    "render_markdown",
]


@dataclass(frozen=True, slots=True)
class Heading:
    """A heading of `level` 1 (the title) to 3."""

    level: int
    text: str


@dataclass(frozen=True, slots=True)
class Paragraph:
    """A paragraph of plain text (escaped in HTML)."""

    text: str


@dataclass(frozen=True, slots=True)
class Bullets:
    """A bulleted list."""

    items: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A table of text cells, one tuple per row."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class Image:
    """A PNG: linked by `filename` in Markdown, embedded in HTML."""

    filename: str
    alt: str


Block = Heading | Paragraph | Table | Image | Bullets


def render_markdown(blocks: Sequence[Block]) -> str:
    """The blocks as Markdown; images are links to their file names."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {markdown_text(block.text)}")
        elif isinstance(block, Paragraph):
            parts.append(markdown_text(block.text, line_start=True))
        elif isinstance(block, Table):
            lines = [_md_row(block.headers), "|" + "---|" * len(block.headers)]
            lines += [_md_row(row) for row in block.rows]
            parts.append("\n".join(lines))
        elif isinstance(block, Image):
            parts.append(f"![{_alt(block.alt)}]({_link(block.filename)})")
        else:
            parts.append(
                "\n".join(f"- {markdown_text(item, line_start=True)}" for item in block.items)
            )
    return "\n\n".join(parts) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(markdown_text(c) for c in cells) + " |"


def _alt(text: str) -> str:
    """An image's text: as in a paragraph, and brackets as character references (a bracket
    in an image's text would otherwise close it, or open a link, in some renderers)."""
    escaped = markdown_text(text).replace("\\]", "]")
    return escaped.replace("[", "&#91;").replace("]", "&#93;")


def _link(filename: str) -> str:
    """A file name as a Markdown link destination: percent-encoded, so that no character of
    it ends the link."""
    return urllib.parse.quote(filename)


_HTML_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0;font-size:90%}"
    "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}"
    "th{background:#eee}td:first-child,td:nth-child(2){text-align:left}"
    "img{max-width:100%}"
)


def render_html(blocks: Sequence[Block], images: Mapping[str, bytes]) -> str:
    """The blocks as one HTML page with no external references: `images` (file name → PNG
    bytes) are embedded as data URLs."""
    esc = html_text
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Scaling report</title>',
        f"<style>{_HTML_STYLE}</style></head><body>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{esc(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{esc(block.text)}</p>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{esc(h)}</th>" for h in block.headers)
            body = "".join(
                "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in block.rows
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, Image):
            data = base64.b64encode(images[block.filename]).decode("ascii")
            parts.append(f'<p><img alt="{esc(block.alt)}" src="data:image/png;base64,{data}"></p>')
        else:
            parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in block.items) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def format_seconds(seconds: float) -> str:
    """Seconds for a table or a label: whole above 100, 2 decimals above 1, else 3 digits."""
    if not math.isfinite(seconds):
        return "n/a"
    if seconds >= 100:
        return f"{seconds:.0f}"
    if seconds >= 1:
        return f"{seconds:.2f}"
    return f"{seconds:.3g}"


def format_bytes(count: float) -> str:
    """Bytes for a table: `4.00 MiB`, `512 B`."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"
