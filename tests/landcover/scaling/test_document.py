"""The report's document rendered both ways, and the number formats of its tables."""

from __future__ import annotations

import base64

import pytest

from landcover.scaling.document import (
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    format_bytes,
    format_seconds,
    render_html,
    render_markdown,
)

BLOCKS = (
    Heading(1, "Scaling <report>"),
    Paragraph("a & b"),
    Table(("mode", "time"), (("none | fp16", "1.00"),)),
    Image("scaling-cpu.png", "Measured"),
    Bullets(("one", "two")),
)


def test_markdown_escapes_html_and_table_pipes_and_links_images() -> None:
    assert render_markdown(BLOCKS) == (
        "# Scaling &lt;report&gt;\n\na & b\n\n| mode | time |\n|---|---|\n| none \\| fp16 | 1.00 |"
        "\n\n![Measured](scaling-cpu.png)\n\n- one\n- two\n"
    )


def test_html_escapes_text_and_embeds_images() -> None:
    png = b"\x89PNG"
    page = render_html(BLOCKS, {"scaling-cpu.png": png})
    assert "<h1>Scaling &lt;report&gt;</h1>" in page and "<p>a &amp; b</p>" in page
    assert "<td>none | fp16</td>" in page and "<li>two</li>" in page
    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in page
    assert "scaling-cpu.png" not in page


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(float("nan"), "n/a"), (123.4, "123"), (12.345, "12.35"), (0.01234, "0.0123")],
)
def test_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_bytes() -> None:
    assert [format_bytes(n) for n in (512, 4 * 2**20, 3 * 2**30)] == [
        "512 B",
        "4.00 MiB",
        "3.00 GiB",
    ]
