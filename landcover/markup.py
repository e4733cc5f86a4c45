"""User strings as data in the documents the project writes.

File and directory names, class names, tags, titles, device and run names reach HTML pages,
JSON inside a page's `<script>`, Markdown files, matplotlib figures and the one-line errors of
the command line. They go there only through these functions, which make each one text that
shows as written and is never read as markup: no element, script, link, table cell break,
emphasis or mathtext comes out of a name, nor a terminal escape sequence or a line of its own.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "html_text",
    "markdown_text",
    "plain_figures",
    "plot_text",
    "script_json",
    "terminal_text",
]

# In JSON these appear only inside strings, where the \u escapes mean the same characters; in
# a <script> element "<" could open "</script>" or "<!--", and U+2028/2029 end a line in older
# JavaScript parsers.
_SCRIPT_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)
# Markdown that a name could start, escaped with a backslash (CommonMark, GFM and
# Python-Markdown agree on these escapes): emphasis and strong (*, and _ unless inside a word),
# code spans, table cell ends, strikethrough, math, headings, and a link or image (a "]" that
# a "(", "[" or ":" follows). A backslash is doubled where it would escape what follows.
_MARKDOWN_INLINE = re.compile(
    r"""\\(?=[!-/:-@\[-`{-~])|[`*|$~#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=[(\[:])|^\["""
)
# HTML: every < and >, and an & that would start a character reference.
_HTML_IN_MARKDOWN = re.compile(r"<|>|&(?=#|[A-Za-z0-9]+;)")
# What makes a block of a line's start: a list item, quote, setext underline or thematic break.
_MARKDOWN_LINE_START = re.compile(r"^(\s*\d*)((?<=\d)[.)](?=\s|$)|(?<!\d)[-+=>](?=\s|$|[-=]))")


def html_text(text: object) -> str:
    """`text` for an HTML element's content or a quoted attribute value."""
    return html.escape(str(text), quote=True)


def script_json(value: Any) -> str:
    """`value` as JSON that can stand inside a `<script>` element: no `<`, `>` or `&` (so no
    `</script>` and no `<!--`), nor a line separator, outside escapes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_SCRIPT_ESCAPES)


def markdown_text(text: object, *, line_start: bool = False) -> str:
    """`text` for Markdown, on one line: in a table cell, a heading or mid-line (with
    `line_start`, also for the start of a paragraph or list item). HTML characters become
    entities (Markdown passes raw HTML through) and Markdown punctuation that would act is
    escaped with a backslash; other characters stay as they are."""
    one_line = " ".join(str(text).splitlines()).replace("\t", " ")
    escaped = _HTML_IN_MARKDOWN.sub(lambda m: html.escape(m.group(0), quote=False), one_line)
    escaped = _MARKDOWN_INLINE.sub(lambda m: "\\" + m.group(0), escaped)
    if line_start:
        escaped = _MARKDOWN_LINE_START.sub(r"\1\\\2", escaped)
    return escaped


def plot_text(text: object) -> str:
    """`text` for a matplotlib title, label, tick label, legend entry or table cell: every `$`
    escaped (no mathtext), and a leading `_` kept from hiding a legend entry."""
    plain = str(text).replace("$", "\\$")
    return " " + plain if plain.startswith("_") else plain


@contextmanager
def plain_figures() -> Iterator[None]:
    """Draw and save figures inside this context: text through `plot_text` stays plain even
    where a matplotlibrc turns on `text.usetex` (LaTeX reads `_`, `%`, `&` and `#`)."""
    import matplotlib

    with matplotlib.rc_context({"text.usetex": False}):
        yield


def terminal_text(text: object) -> str:
    """`text` for one line on a terminal: control characters (escape, carriage return,
    backspace, newline, tab, C1 controls), line and paragraph separators, and invisible format
    characters (bidirectional overrides, zero-width spaces) are written as Python escapes
    (`\\x1b`, `\\u202e`), so that a name can neither clear, move or recolour the screen,
    reorder what is shown, nor start a line of its own; every other character stays."""
    return "".join(_terminal_char(c) for c in str(text))


_TERMINAL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _terminal_char(c: str) -> str:
    # Not printable: Cc, Cf, Cs, Co, Cn, Zl, Zp, and spaces other than " " (Python's rule).
    if c.isprintable():
        return c
    if c in _TERMINAL_ESCAPES:
        return _TERMINAL_ESCAPES[c]
    code = ord(c)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )
