"""The run directory of `landcover train` (docs/CONTRACTS.md) and how rank 0 writes it.

```
RUN_DIR/run.json          the run: world, machine, versions, store, config (written once)
RUN_DIR/metrics.jsonl     one JSON object per epoch
RUN_DIR/checkpoints/      last.pt: everything a resume needs
RUN_DIR/model.pt          the self-describing model file (landcover.models.modelfile)
RUN_DIR/tensorboard/      TensorBoard event files (landcover.training.tracking)
RUN_DIR/mlflow.json       the MLflow run that a resume continues, when MLflow tracks the run
```

Checkpoints themselves are read and written by `landcover.training.checkpoint` (torch);
this module imports no torch, so readers of a run (the scaling report) do not pay for it.

Nothing half-written is ever trusted: run.json, checkpoints and model.pt are written under a
temp name and renamed. metrics.jsonl grows by one line per epoch, written before that epoch's
checkpoint, so a worker killed between the two leaves a line the checkpoint does not know; a
resume therefore rewrites metrics.jsonl from the checkpoint's own copy of the records.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from landcover import outputs
from landcover.errors import TrainingError
from landcover.training.records import RUN_KEYS

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
MODEL_FILE = "model.pt"
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.pt"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_FILE = "mlflow.json"
RESULT_NAMES = (METRICS_FILE, RUN_FILE, MODEL_FILE, CHECKPOINT_DIR)
# what the epochs of a run trained: a fresh start never replaces them under --resume
TRAINED_NAMES = (MODEL_FILE, METRICS_FILE)
# what a fresh start clears besides the results: tracking of the run it replaces
TRACKING_NAMES = (TENSORBOARD_DIR, MLFLOW_FILE)
# The fixes for a run that cannot be continued: the same words in every refusal
# (check_run_dir, landcover.training.checkpoint, landcover.training.resume).
NO_CHECKPOINT = f"it has no checkpoint to resume ({CHECKPOINT_DIR}/{LAST_CHECKPOINT})"
START_OVER = "pass --overwrite to replace this run, or train into a new --out"


def check_run_dir(out_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
    """Refuse a run dir that takes no new files, or that already holds results, unless told to
    overwrite them, or to resume a run that has a checkpoint to resume.

    `--resume` with no checkpoint (a finished run whose checkpoint was deleted) is refused as a
    run without `--resume` is: starting fresh would replace its model.pt and metrics.jsonl
    (`trained_results`). A run dir holding no trained result (a run stopped before its first
    checkpoint, only run.json and tracking) starts fresh, which a restarted worker group needs.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: exists and is not a directory; choose another --out")
    outputs.check_can_create_in(out, option="--out")
    if overwrite:
        return
    found = [name for name in RESULT_NAMES if os.path.lexists(out / name)]  # links count
    has_checkpoint = os.path.lexists(last_checkpoint(out))
    if found and not resume:
        fix = (
            "pass --resume to continue it or --overwrite to replace it"
            if has_checkpoint
            else f"{NO_CHECKPOINT}; {START_OVER}"
        )
        raise TrainingError(f"{out}: already holds a training run ({', '.join(found)}); {fix}")
    trained = trained_results(out)
    if resume and trained and not has_checkpoint:
        raise TrainingError(
            f"{out}: already holds a training run ({', '.join(trained)}); {NO_CHECKPOINT}, "
            f"which --resume needs; {START_OVER}"
        )


def trained_results(out_dir: str | os.PathLike[str]) -> list[str]:
    """The files of RUN_DIR that hold what its epochs trained (model.pt, metrics.jsonl): what a
    fresh start would destroy."""
    return [name for name in TRAINED_NAMES if os.path.lexists(Path(out_dir) / name)]


def last_checkpoint(out_dir: str | os.PathLike[str]) -> Path:
    """RUN_DIR/checkpoints/last.pt, the checkpoint a resume continues from."""
    return Path(out_dir) / CHECKPOINT_DIR / LAST_CHECKPOINT


def prepare_run_dir(
    out_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool
) -> Path | None:
    """Check the run dir (`check_run_dir`), then return the checkpoint to resume from, or clear
    old results (and return None) when there is none to resume or `overwrite` is set."""
    out = Path(out_dir)
    check_run_dir(out, resume=resume, overwrite=overwrite)
    last = last_checkpoint(out)
    if resume and os.path.lexists(last):
        return last
    if resume:
        logger.info("%s: no checkpoint and no trained result to resume; starting fresh", out)
    for name in (*RESULT_NAMES, *TRACKING_NAMES):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return None


@contextmanager
def removed_if_left_empty(out_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Run the block; when it fails, remove the directories of `out_dir` (it and its parents)
    that did not exist before it and are empty: a `train` that fails before writing anything
    (a bad store, option or model) leaves no empty run dir behind. A directory that holds
    anything stays, and so does one that existed before."""
    path = Path(out_dir).absolute()
    created = [p for p in (path, *path.parents) if not os.path.lexists(p)]  # deepest first
    try:
        yield
    except BaseException:
        for directory in created:
            try:
                directory.rmdir()  # only when empty
            except FileNotFoundError:
                continue  # never made: a parent may have been (the lock file's)
            except OSError:
                break  # not empty: nor are its parents
        raise


def write_atomic(path: Path, write: Callable[[str], object]) -> None:
    """Write through a temp file in the same directory, then rename: never a half file
    (`landcover.outputs.write_atomic`: fsynced, with the umask's permissions)."""
    outputs.write_atomic(path, write)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps(jsonable(obj), indent=2) + "\n"))


def write_run_json(run_dir: str | os.PathLike[str], info: Mapping[str, Any]) -> None:
    """run.json from `RunInfo.model_dump()`, which must hold RUN_KEYS."""
    missing = [key for key in RUN_KEYS if info.get(key) is None]
    if missing:
        raise ValueError(f"run.json needs the keys {missing}")  # a bug, not a user error
    write_json_atomic(Path(run_dir) / RUN_FILE, info)


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of metrics.jsonl, in epoch order ([] when there is none yet)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics_line(record: Mapping[str, Any]) -> str:
    """One metrics.jsonl line from `EpochRecord.model_dump()` (NaN as null), no newline."""
    return json.dumps(jsonable(record))


def append_metrics(run_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    with (Path(run_dir) / METRICS_FILE).open("a") as f:
        f.write(metrics_line(record) + "\n")


def rewrite_metrics(run_dir: str | os.PathLike[str], records: Sequence[Mapping[str, Any]]) -> None:
    """Replace metrics.jsonl by `records` (a checkpoint's: drops the epochs it has not seen)."""
    text = "".join(metrics_line(record) + "\n" for record in records)
    write_atomic(Path(run_dir) / METRICS_FILE, lambda tmp: Path(tmp).write_text(text))


def jsonable(obj: Any) -> Any:
    """Plain JSON values from configs, store summaries, numpy scalars; NaN becomes null."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "to_json"):
        return jsonable(obj.to_json())
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if hasattr(obj, "tolist"):  # numpy arrays and torch tensors, without importing torch
        return jsonable(obj.tolist())
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def utc_now() -> str:
    """ISO 8601 UTC, to the second, as metrics.jsonl's `time`."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
