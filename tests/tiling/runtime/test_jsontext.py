"""The one-line report of JSON text that does not parse (`tiling.runtime.jsontext`)."""

from __future__ import annotations

import json

import pytest

from tiling.errors import SourceFormatError
from tiling.runtime.jsontext import json_syntax, parse_json


def test_valid_text_is_parsed_from_str_and_bytes() -> None:
    text = '{"a": [1, 2.5, null]}'
    expected = {"a": [1, 2.5, None]}
    assert parse_json(text, where="x", fix="f", error=SourceFormatError) == expected
    assert parse_json(text.encode(), where="x", fix="f", error=SourceFormatError) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": 1,}', "Expecting property name enclosed in double quotes at line 1 column 9"),
        ('{\n  "a": 1\n  "b": 2\n}', "Expecting ',' delimiter at line 3 column 3"),
        ("", "Expecting value at line 1 column 1"),
    ],
)
def test_text_that_is_not_json_is_one_line_with_where_the_reason_and_the_fix(
    text: str, reason: str
) -> None:
    with pytest.raises(SourceFormatError) as caught:
        parse_json(
            text, where="doc.json", problem="not a document", fix="fix it", error=SourceFormatError
        )
    assert str(caught.value) == f"doc.json: not a document ({reason}); fix it"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_reason_names_line_and_column_of_a_parser_error() -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads("[1,\n 2,,]")
    assert json_syntax(caught.value) == "Expecting value at line 2 column 4"
