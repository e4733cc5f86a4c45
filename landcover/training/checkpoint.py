"""checkpoints/last.pt: written by rank 0 after every epoch, read by a resume.

The payload is `landcover.training.records.Checkpoint.to_payload()` (plain values and CPU
tensors, loadable with `weights_only=True`), stamped with the current format and version;
`Checkpoint.from_payload` migrates older versions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from landcover.errors import TrainingError
from landcover.training.records import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from landcover.training.rundir import CHECKPOINT_DIR, LAST_CHECKPOINT, START_OVER, write_atomic


def save_checkpoint(run_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> None:
    """checkpoints/last.pt from `Checkpoint.to_payload()`: plain values and CPU tensors
    (loads with weights_only=True), under the current format and version."""
    content = {**payload, "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION}
    path = Path(run_dir) / CHECKPOINT_DIR / LAST_CHECKPOINT
    write_atomic(path, lambda tmp: torch.save(content, tmp))


def read_checkpoint(path: Path, *, must_match: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of a checkpoint written by `save_checkpoint` (any version: see
    `Checkpoint.from_payload`), refused unless its config has the values of `must_match`
    (options a resumed run cannot change). A checkpoint that cannot be resumed is refused with
    the fix every such refusal gives (`rundir.START_OVER`): deleting it would not help, since a
    run dir with results and no checkpoint is refused too (`rundir.check_run_dir`)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise TrainingError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}), which --resume cannot "
            f"continue; {START_OVER}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise TrainingError(
            f"{path}: not a landcover checkpoint, which --resume cannot continue; {START_OVER}"
        )
    if int(payload.get("version", 0)) > CHECKPOINT_VERSION:
        raise TrainingError(f"{path}: checkpoint from a newer landcover; upgrade landcover")
    saved = payload["config"]
    for key, value in must_match.items():
        if saved.get(key) != value:
            raise TrainingError(
                f"{path}: checkpoint was trained with --{key.replace('_', '-')} "
                f"{saved.get(key)}, not {value}; pass the same value, or {START_OVER}"
            )
    return dict(payload)


def to_cpu(obj: Any) -> Any:
    """A copy of nested dicts/lists/tuples with every tensor detached onto the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, Mapping):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
