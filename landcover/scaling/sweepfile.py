"""sweep.json: the typed record `landcover scale` writes and the scaling report reads.

One definition for both sides: `SweepRecord` (the file) and `SweepRun` (one worker count's run,
also written alone as `DIR/workers-N/launch.json`). Fields are in docs/CONTRACTS.md (sweep
directory). Every field is written, null where it is unknown. A file is read through
`migrate`, the one place that knows older forms: a sweep.json without a format (a list of runs,
or `{"runs": [...]}` with any of the header fields) becomes the current version, with null for
what it did not record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from landcover.errors import ReportError
from landcover.outputs import write_text_atomic
from tiling.runtime.jsontext import json_syntax

__all__ = [
    "LAUNCH_FILE",
    "SWEEP_FILE",
    "SWEEP_FORMAT",
    "SWEEP_VERSION",
    "RunStatus",
    "SweepRecord",
    "SweepRun",
    "migrate",
    "read_sweep",
    "write_launch",
    "write_sweep",
]

SWEEP_FILE = "sweep.json"
LAUNCH_FILE = "launch.json"
SWEEP_FORMAT: Final = "landcover-sweep"
SWEEP_VERSION: Final = 1

RunStatus = Literal["done", "failed", "submitted"]


class _Record(BaseModel):
    # every field given (null where unknown), nothing else: the writer and the reader agree
    model_config = ConfigDict(frozen=True, extra="forbid")


class SweepRun(_Record):
    """One worker count's run. `run_dir` is relative to the sweep directory; it, `nodes`,
    `processes_per_node`, `oversubscribed` and `epochs_done` are null only in a migrated file
    that did not record them (a run without a directory is matched by its worker count)."""

    workers: int = Field(ge=1)
    nodes: int | None
    processes_per_node: int | None
    threads_per_worker: int | None  # the --threads the workers got
    cores: int | None  # cores the run had; null: unknown
    oversubscribed: bool | None  # workers > cores (local engine only)
    run_dir: str | None
    status: RunStatus
    error: str | None  # one line
    job_id: str | None
    log_dir: str | None  # relative to the sweep directory, a URL, or null
    wall_time_s: float | None  # launch to exit, startup and load included
    epochs_done: int | None  # records in metrics.jsonl
    epoch_time_s: float | None
    samples_per_s: float | None

    def describe(self) -> str:
        """The run as a phrase for a log line: `workers-4 (4 workers, status failed): out of
        memory` (the first line of the error)."""
        text = f"{self.run_dir or 'a run'} ({self.workers} workers, status {self.status})"
        error = (self.error or "").strip()
        return f"{text}: {error.splitlines()[0]}" if error else text


class SweepRecord(_Record):
    """The whole sweep.json: the settings every run shared, then the runs in worker order."""

    format: Literal["landcover-sweep"] = SWEEP_FORMAT
    version: Literal[1] = SWEEP_VERSION
    engine: str | None
    cluster: str | None  # the cluster spec's name
    vm_size: str | None
    host: str | None  # the machine that ran the sweep
    cores: int | None  # cores usable on that machine
    store: str | None  # redacted
    epochs: int | None = Field(ge=1)
    train_args: tuple[str, ...]  # extra training args, redacted
    entry_module: str | None
    created: str | None
    updated: str | None
    runs: tuple[SweepRun, ...]

    def differences(self, other: SweepRecord) -> list[str]:
        """The settings (engine, store, epochs, ...) in which `other` differs from this sweep,
        each with both values: `--epochs 2 (now 3)`."""
        pairs = [(name, getattr(self, key), getattr(other, key)) for key, name in _SETTINGS.items()]
        return [f"{name} {_text(a)} (now {_text(b)})" for name, a, b in pairs if a != b]


# the settings every run of a sweep shares, by how a refusal names them
_SETTINGS = {
    "engine": "engine",
    "cluster": "--cluster-json cluster",
    "vm_size": "vmSize",
    "store": "STORE",
    "epochs": "--epochs",
    "train_args": "training arguments",
    "entry_module": "--entry-module",
}


def _text(value: Any) -> str:
    """A setting's value in a refusal: training arguments as one bracketed list."""
    return f"[{' '.join(value)}]" if isinstance(value, tuple) else str(value)


_FAILED_WORDS = {"failed", "error", "crashed"}


def migrate(data: Any) -> dict[str, Any]:
    """sweep.json as any version wrote it → the fields of the current version (raises
    ValueError naming what is wrong)."""
    if isinstance(data, dict) and "format" in data:
        if data["format"] != SWEEP_FORMAT or data.get("version") != SWEEP_VERSION:
            raise ValueError(
                f"format {data['format']!r} version {data.get('version')!r} is not "
                f"{SWEEP_FORMAT!r} version {SWEEP_VERSION}"
            )
        return data
    # before the format was pinned: a list of runs or {"runs": [...]}, every other key optional
    header = data if isinstance(data, dict) else {"runs": data}
    runs = header.get("runs")
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        raise ValueError("expected a list of run objects (or {'runs': [...]})")
    fields = {name: header.get(name) for name in SweepRecord.model_fields}
    return {
        **fields,
        "format": SWEEP_FORMAT,
        "version": SWEEP_VERSION,
        "train_args": header.get("train_args") or [],
        "runs": [_migrate_run(run) for run in runs],
    }


def _migrate_run(run: dict[str, Any]) -> dict[str, Any]:
    # an exit code instead of a status; any of the words for a failure
    returncode = run.get("returncode")
    crashed = returncode not in (None, 0)
    failed = crashed or str(run.get("status", "")).lower() in _FAILED_WORDS
    error = run.get("error") or (f"exit code {returncode}" if crashed else None)
    fields = {name: run.get(name) for name in SweepRun.model_fields}
    return {**fields, "status": "failed" if failed else "done", "error": error}


def read_sweep(path: Path) -> SweepRecord:
    """The sweep.json at `path`, migrated to the current version. Raises ReportError naming
    the file and the fix."""
    try:
        return SweepRecord.model_validate(migrate(json.loads(path.read_text(encoding="utf-8"))))
    except json.JSONDecodeError as exc:
        reason = f"not valid JSON ({json_syntax(exc)})"
    except (OSError, UnicodeDecodeError) as exc:
        reason = f"cannot be read ({exc})"
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        reason = f"{where}: {first['msg']}, got {first.get('input')!r}"
    except ValueError as exc:
        reason = str(exc)
    raise ReportError(
        f"{path}: {reason}; rerun `landcover scale` with --overwrite to replace it, or delete "
        "it to read the run directories beside it alone"
    )


def write_sweep(path: str | os.PathLike[str], record: SweepRecord) -> None:
    """Write `record` to `path` atomically (a reader sees the old file or the whole new one)."""
    _write(path, record)


def write_launch(run_dir: Path, run: SweepRun) -> None:
    """Write one run's record alone to `run_dir/launch.json`."""
    _write(run_dir / LAUNCH_FILE, run)


def _write(path: str | os.PathLike[str], record: _Record) -> None:
    write_text_atomic(path, json.dumps(record.model_dump(mode="json"), indent=2) + "\n")
