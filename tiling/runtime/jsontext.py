"""JSON text from a file, a service or a line of a log, parsed or refused in one line.

Every reader of a JSON document that a user or a service hands us (cluster.json, a STAC
document or API page, a GeoJSON region, a run's run.json, metrics.jsonl and sweep.json)
reports a syntax error the same way: where, what the text should have been, the parser's
reason with its line and column, and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["json_syntax", "parse_json"]


def json_syntax(exc: json.JSONDecodeError) -> str:
    """Why and where text is not JSON, e.g. "Expecting value at line 3 column 7"."""
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def parse_json(
    text: str | bytes,
    *,
    where: str,
    fix: str,
    error: Callable[[str], Exception],
    problem: str = "not valid JSON",
) -> Any:
    """`text` parsed; text that is not JSON raises `error("<where>: <problem> (<reason at
    line and column>); <fix>")`, without the parser's traceback."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: {problem} ({json_syntax(exc)}); {fix}") from None
