"""metrics.jsonl as the scaling report and the sweep read it: every line validated as the
trainer's own `EpochRecord` (`landcover.training.records`, fields in docs/CONTRACTS.md), one
line naming the file, the line and the fix for every bad record, so that a hand-edited or
truncated file is refused with a reason rather than read as numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from landcover.errors import ReportError
from landcover.training.records import EpochRecord
from tiling.runtime.jsontext import parse_json

__all__ = ["is_int", "parse_metrics_line", "read_epoch_records", "read_finished_epochs"]

logger = logging.getLogger(__name__)

# fields that must not change between the epochs of one run
_CONSTANT = ("world_size", "device", "compression", "block_momentum", "batch_size", "nodes")


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's true is not a count); sweep.json's readers use it."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_epoch_records(path: Path) -> list[EpochRecord]:
    """The epochs of a metrics.jsonl, checked and in epoch order; a resumed run rewrites
    epochs, and the last record of an epoch wins. ReportError on the first bad line."""
    records = _by_epoch(path, _read_lines(path), skip_bad=False)
    if not records:
        raise ReportError(
            f"{path}: empty, no epoch has finished; wait for the run's first epoch or leave "
            f"{path.parent} out"
        )
    for name in _CONSTANT:
        values = {json.dumps(getattr(r, name)) for r in records}
        if len(values) > 1:
            raise ReportError(
                f"{path}: {name} changes between epochs ({', '.join(sorted(values))}); one run "
                "directory must hold one configuration: train each in its own --out"
            )
    return records


def read_finished_epochs(path: Path) -> list[EpochRecord]:
    """The epochs of a run that may still be running or was killed: as `read_epoch_records`,
    but a bad line (a torn last line) is skipped with a warning; [] without a file."""
    if not path.exists():
        return []
    return _by_epoch(path, _read_lines(path), skip_bad=True)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None


def _by_epoch(path: Path, lines: list[str], *, skip_bad: bool) -> list[EpochRecord]:
    by_epoch: dict[int, EpochRecord] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_metrics_line(path, number, line)
        except ReportError as exc:
            if not skip_bad:
                raise
            logger.warning("%s (skipped)", exc)
            continue
        by_epoch[record.epoch] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def parse_metrics_line(path: Path, number: int, line: str) -> EpochRecord:
    """Line `number` of metrics.jsonl `path` as an EpochRecord; ReportError naming the fix."""
    raw = parse_json(
        line,
        where=str(path),
        problem=f"line {number} is not valid JSON",
        fix="delete that line or rerun the training",
        error=ReportError,
    )
    if not isinstance(raw, dict):
        raise ReportError(f"{path}: line {number} is not a JSON object; delete that line")
    try:
        return EpochRecord.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
    required = EpochRecord.required_fields()
    missing = [str(e["loc"][0]) for e in errors if e["type"] == "missing"]
    if missing:
        raise ReportError(
            f"{path}: line {number} lacks {', '.join(missing)}; the report needs "
            f"{', '.join(required)} on every line (docs/CONTRACTS.md, metrics.jsonl)"
        ) from None
    name = str(errors[0]["loc"][0])
    raise ReportError(
        f"{path}: line {number}: {name} must be {EpochRecord.wanted(name)}, got "
        f"{json.dumps(raw.get(name))}; fix or delete that line"
    ) from None
