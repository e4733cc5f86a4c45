"""metrics.jsonl as the scaling report reads it: the fields it needs, the kind of value each
must hold, and one line naming the file, the line and the fix for every bad record.

The trainer writes the file (`landcover.training.rundir.append_metrics`, fields in
docs/CONTRACTS.md);
this is the reading side's check, so that a hand-edited or truncated file is refused with a
reason rather than read as numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from landcover.errors import ReportError

__all__ = ["is_int", "is_number", "read_epoch_records"]

# metrics.jsonl fields the report reads → the kind of value each must hold (see _KINDS)
_REQUIRED: dict[str, str] = {
    "epoch": "int>=1",
    "world_size": "int>=1",
    "epoch_time_s": "number>0",
    "load_time_s": "number>=0",
    "steps": "int>=1",
    "batch_size": "int>=1",
    "comm_bytes_per_step": "number>=0",
    "device": "str",
    "compression": "str",
    "block_momentum": "bool",
}
_OPTIONAL: dict[str, str] = {  # may also be null
    "nodes": "int>=1",
    "threads_per_worker": "int>=1",
    "samples_per_s": "number>0",
    "model": "str",
    "host": "str",
}
# fields that must not change between the epochs of one run
_CONSTANT = ("world_size", "device", "compression", "block_momentum", "batch_size", "nodes")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int>=1": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "number>0": (lambda v: is_number(v) and v > 0, "a positive number"),
    "number>=0": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
}


def read_epoch_records(path: Path) -> list[dict[str, Any]]:
    """The epochs of a metrics.jsonl, checked and in epoch order; a resumed run rewrites
    epochs, and the last record of an epoch wins."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    by_epoch: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines, start=1):
        if line.strip():
            record = _parse_metrics_line(path, number, line)
            by_epoch[record["epoch"]] = record
    if not by_epoch:
        raise ReportError(
            f"{path}: empty, no epoch has finished; wait for the run's first epoch or leave "
            f"{path.parent} out"
        )
    records = [by_epoch[e] for e in sorted(by_epoch)]
    for name in _CONSTANT:
        values = {json.dumps(r.get(name)) for r in records}
        if len(values) > 1:
            raise ReportError(
                f"{path}: {name} changes between epochs ({', '.join(sorted(values))}); one run "
                "directory must hold one configuration: train each in its own --out"
            )
    return records


def _parse_metrics_line(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: line {number} is not valid JSON ({exc.msg}); delete that line or "
            "rerun the training"
        ) from None
    if not isinstance(record, dict):
        raise ReportError(f"{path}: line {number} is not a JSON object; delete that line")
    missing = [name for name in _REQUIRED if name not in record]
    if missing:
        raise ReportError(
            f"{path}: line {number} lacks {', '.join(missing)}; the report needs "
            f"{', '.join(_REQUIRED)} on every line (docs/CONTRACTS.md, metrics.jsonl)"
        )
    for name, kind in (*_REQUIRED.items(), *_OPTIONAL.items()):
        value = record.get(name)
        is_valid, wanted = _KINDS[kind]
        if not is_valid(value) and not (name in _OPTIONAL and value is None):
            raise ReportError(
                f"{path}: line {number}: {name} must be {wanted}, got {json.dumps(value)}; "
                "fix or delete that line"
            )
    return record
