"""What a rerun of a sweep into the same DIR keeps of the earlier one.

A rerun may change the worker counts and reuses a finished point only when it had the new
sweep's per-worker resources; every other setting must match sweep.json's, or the rerun is
refused naming both values. `--overwrite` removes the run directories the earlier sweep.json
recorded, and nothing else. `landcover.scaling.sweep` runs the sweep.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from cluster.errors import ClusterError
from cluster.spec import ClusterSpec
from landcover.errors import ReportError
from landcover.scaling.sweepfile import SweepRecord, SweepRun, read_sweep

__all__ = [
    "SWEEP_RERUN_MAY_CHANGE",
    "SWEEP_RERUN_MUST_MATCH",
    "previous_runs",
    "remove_recorded_runs",
    "same_resources",
]

logger = logging.getLogger(__name__)

# A rerun into DIR may change the worker counts (a finished point is reused when it had the
# new sweep's per-worker resources) and moves or overwrites DIR; every other SweepConfig field
# must match sweep.json's settings (`SweepRecord.differences`), or the rerun is refused
# naming both values. Every field is in one of the two (tests/landcover/scaling/test_sweep.py).
SWEEP_RERUN_MAY_CHANGE = ("workers", "out_dir", "overwrite")
SWEEP_RERUN_MUST_MATCH = ("store", "epochs", "extra_args", "cluster", "entry_module")


def previous_runs(path: Path, record: SweepRecord, overwrite: bool) -> dict[int, SweepRun]:
    """Finished runs of an earlier sweep of the same settings in the same DIR."""
    if overwrite or not path.exists():
        return {}
    old = read_sweep(path)
    changed = old.differences(record)
    if changed:
        raise ClusterError(
            f"{path.parent} holds a sweep with other settings ({'; '.join(changed)}); "
            "pass --overwrite to replace it or choose another --out"
        )
    return {r.workers: r for r in old.runs if r.status == "done"}


def same_resources(run: SweepRun, spec: ClusterSpec, threads: int | None) -> bool:
    """Whether a finished run had what this sweep gives its point: the same threads per
    worker and nodes x processes per node."""
    return (run.threads_per_worker, run.nodes, run.processes_per_node) == (
        threads,
        spec.node_count,
        spec.processes_per_node,
    )


def remove_recorded_runs(path: Path) -> None:
    """--overwrite: remove the run directories the sweep.json at `path` records (those inside
    its directory only; nothing it does not name), then the file. A sweep.json that cannot be
    read names nothing: its directories stay, and the new sweep.json lists only new runs."""
    if not path.exists():
        return
    sweep_dir = path.parent.resolve()
    try:
        old = read_sweep(path)
    except ReportError as exc:
        logger.warning("%s; leaving the run directories beside it in place", exc)
        return
    for run in old.runs:
        if run.run_dir is None:
            continue
        run_dir = path.parent / run.run_dir
        inside = run_dir.resolve().parent == sweep_dir
        if inside and run_dir.is_dir() and not run_dir.is_symlink():
            logger.info("--overwrite: removing %s of the previous sweep", run_dir)
            shutil.rmtree(run_dir)
    path.unlink()
