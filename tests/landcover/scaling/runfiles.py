"""Synthetic run directories for the scaling tests: metrics.jsonl records with every field
docs/CONTRACTS.md lists, run.json, and power-law sweeps for the report and plots."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from landcover.scaling.runs import RunSummary

SAMPLES = 1003  # not a multiple of any workers × batch, so a remainder is dropped
BATCH = 8
CPU = "cpu: Test CPU 9000"


def steps_for(workers: int, samples: int = SAMPLES, batch: int = BATCH) -> int:
    # as the trainer counts them: full batches of the smallest shard, at least one
    return max(1, (samples // workers) // batch)


def metrics_line(
    epoch: int, workers: int, epoch_time_s: float, /, **overrides: Any
) -> dict[str, Any]:
    """One metrics.jsonl record with every field docs/CONTRACTS.md lists."""
    steps = steps_for(workers)
    line: dict[str, Any] = {
        "epoch": epoch,
        "world_size": workers,
        "nodes": 1,
        "epoch_time_s": epoch_time_s,
        "load_time_s": 5.0,
        "val_time_s": 1.5,
        "train_loss": 0.9,
        "val_loss": 1.0,
        "val_miou": 0.4,
        "val_accuracy": 0.7,
        "per_class_iou": [None, 0.5, 0.3],
        "samples_per_s": SAMPLES / epoch_time_s,
        "pixels_per_s": SAMPLES * 256 * 256 / epoch_time_s,
        "step_time_s": epoch_time_s / steps,
        "data_time_s": 0.001,
        "steps": steps,
        "comm_bytes_per_step": 0 if workers == 1 else 4e6,
        "comm_time_s": 0.01,
        "compression": "none",
        "block_momentum": False,
        "model": "unet-resnet18",
        "batch_size": BATCH,
        "device": CPU,
        "threads_per_worker": 1,
        "host": "node-0",
        "lr": 0.01,
        "time": "2026-01-01T00:00:00Z",
    }
    line.update(overrides)
    # the collectives behind comm_bytes_per_step, as the meter records them: one per step, an
    # all-gather under onebit, else an all-reduce (unless a test gives its own)
    sent = line["comm_bytes_per_step"]
    gather = str(line["compression"]).startswith("onebit")
    calls = 1.0 if sent else 0.0
    counts = {
        "comm_allreduce_per_step": 0.0 if gather else calls,
        "comm_allreduce_bytes_per_step": 0.0 if gather else sent,
        "comm_allgather_per_step": calls if gather else 0.0,
        "comm_allgather_bytes_per_step": sent if gather else 0.0,
        "comm_broadcast_per_step": 0.0,
        "comm_broadcast_bytes_per_step": 0.0,
        "comm_buckets_per_step": calls,
    }
    for key, value in counts.items():
        line.setdefault(key, value)
    return line


def write_run(
    root: Path,
    name: str,
    *,
    workers: int,
    epoch_times: Sequence[float],
    run_json: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    lines = [
        json.dumps(metrics_line(epoch, workers, t, **overrides))
        for epoch, t in enumerate(epoch_times, start=1)
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if run_json is not None:
        (run_dir / "run.json").write_text(json.dumps(run_json))
    return run_dir


def power_law_runs(
    root: Path, workers: Sequence[int], *, scale: float = 100.0, exponent: float = -0.8, **kw: Any
) -> list[Path]:
    """Runs with t(N) = scale·N^exponent, a 3× slower warm-up epoch and a +2 % third epoch."""
    out = []
    for n in workers:
        t = scale * n**exponent
        out.append(write_run(root, f"w{n}", workers=n, epoch_times=[3 * t, t, t * 1.02], **kw))
    return out


def only(runs: Sequence[RunSummary], workers: int) -> RunSummary:
    (run,) = [r for r in runs if r.workers == workers]
    return run


# --- reading runs ----------------------------------------------------------------------------
