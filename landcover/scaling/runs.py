"""Training runs as the scaling report sees them: read run directories (and the sweep
directories holding them) into `RunSummary` values.

A run's epoch time is `landcover.training.records.steady_epoch_time_s` (the median without the
warm-up epoch), the sweep's too. The one-time shard load is kept apart, never in epoch time.
A run is oversubscribed when its workers on one host ask for more threads than the host has
cores; the sweep that launched it says so, else run.json's `cores` decides, else it is unknown.
A run is incomplete when it recorded fewer epochs than it was configured for (run.json, else
the sweep's `epochs`) and did not stop early by its --patience: it was killed or is still
running, and its numbers are not a finished measurement.

A sweep directory is read as its sweep.json lists it: only the runs it names (a run directory
beside them that it does not name, an earlier sweep's left in place, is skipped with a
warning). Only a sweep.json of an older form (no `format`), which may list a part of the runs
or name no directory, lets every run directory in the folder in, matched to its entry by
worker count.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from landcover.comm.counts import CommCounts
from landcover.errors import ReportError
from landcover.scaling.metricsfile import is_int, read_epoch_records
from landcover.scaling.sweepfile import SWEEP_FILE, SweepRun, read_sweep
from landcover.training.records import (
    EpochRecord,
    RunInfo,
    steady_epoch_time_s,
    steady_epochs,
    steady_samples_per_s,
)
from landcover.training.rundir import METRICS_FILE, RUN_FILE
from tiling.runtime.jsontext import parse_json

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run directory reduced to the numbers a scaling curve needs."""

    run_dir: Path
    device: str
    compression: str
    block_momentum: bool
    model: str | None
    batch_size: int
    workers: int
    nodes: int
    threads_per_worker: int | None
    epochs: tuple[int, ...]
    epochs_used: tuple[int, ...]
    epoch_times_s: tuple[float, ...]
    epoch_time_s: float  # median over epochs_used
    load_time_s: float
    steps: int
    samples_per_epoch: int
    samples_per_s: float  # median over epochs_used: samples trained (full batches) per second
    comm_bytes_per_step: float
    comm_counts: CommCounts  # collectives per step by kind, medians over epochs_used
    comm_time_s: float | None  # per step, median over epochs_used; None: not recorded
    vm_size: str | None
    cores: int | None
    oversubscribed: bool | None  # None: unknown (no sweep.json and no core count)
    oversubscribed_source: str | None
    store: str | None  # the chip store's URL (run.json); None: not recorded
    epochs_planned: int | None  # --epochs of the run; None: not recorded
    stopped_early: bool  # by --patience, before epochs_planned
    store_digest: str | None = None  # the store's content digest (run.json); None: not recorded
    chip_size_px: int | None = None  # the store's chip size (run.json); None: not recorded
    amp: bool | None = None  # mixed precision (run.json); None: not recorded

    @property
    def label(self) -> str:
        return str(self.run_dir)

    @property
    def complete(self) -> bool | None:
        """Whether the run finished: every planned epoch, or an early stop by --patience;
        None when nothing says how many epochs it planned."""
        if self.stopped_early:
            return True
        if self.epochs_planned is None:
            return None
        return max(self.epochs) >= self.epochs_planned

    @property
    def progress(self) -> str:
        """`6 of 6`, `2 of 30 (incomplete)`, `4 of 10 (early stop)` or `3 of ?`."""
        done = max(self.epochs)
        if self.epochs_planned is None:
            return f"{done} of ?"
        text = f"{done} of {self.epochs_planned}"
        if self.stopped_early:
            return f"{text} (early stop)"
        return text if self.complete else f"{text} (incomplete)"

    @property
    def step_time_s(self) -> float:
        return self.epoch_time_s / self.steps


@dataclass(frozen=True, slots=True)
class _Sweep:
    """What a sweep.json says about the run directories beside it (nothing without one)."""

    file: Path
    named: dict[Path, tuple[Path, SweepRun]]  # resolved run dir → (run dir, its run)
    unnamed: tuple[SweepRun, ...]  # runs naming no directory: matched by worker count
    failed: dict[Path, SweepRun]  # resolved run dir → a run the sweep marks failed
    epochs: int | None  # the --epochs the sweep gave every run
    # the current form, as `landcover scale` writes it: it names every run of the sweep, and
    # only those are its runs (an older form may list some runs, or none, by worker count)
    lists_runs: bool = False

    def entry_for(self, run_dir: Path, workers: int) -> SweepRun | None:
        """The run naming `run_dir`, else the one unnamed run with `workers` workers."""
        named = self.named.get(run_dir.resolve())
        if named is not None:
            return named[1]
        matches = [run for run in self.unnamed if run.workers == workers]
        return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True, slots=True)
class _Source:
    run_dir: Path
    sweep: _Sweep


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> list[RunSummary]:
    """Read run directories (written by `landcover train --out`) and sweep directories (a
    `sweep.json` and/or subdirectories that are runs). Raises ReportError on bad input."""
    sources: dict[Path, _Source] = {}
    for raw in paths:
        for source in _expand(Path(raw)):
            sources.setdefault(source.run_dir.resolve(), source)
    if not sources:
        raise ReportError("no run directories given; pass the --out of `landcover train` runs")
    runs = [_summarise(source) for source in sources.values()]
    logger.info("read %d runs", len(runs))
    return runs


def _expand(path: Path) -> list[_Source]:
    if path.name == METRICS_FILE and path.is_file():
        path = path.parent
    if not path.is_dir():
        raise ReportError(
            f"{path}: no such directory; pass run directories written by `landcover train --out` "
            "or a sweep directory"
        )
    if (path / METRICS_FILE).exists():
        return [_Source(path, _load_sweep(path.parent))]
    sweep = _load_sweep(path)
    for run_dir, _ in sweep.named.values():
        if not (run_dir / METRICS_FILE).is_file():
            raise ReportError(
                f"{run_dir}: listed in {sweep.file} but has no {METRICS_FILE}; the run did not "
                "finish an epoch: rerun it, or pass the other run directories one by one"
            )
    for entry in sweep.failed.values():
        logger.warning(
            "%s: skipping a run the sweep marks as failed: %s", sweep.file, entry.describe()
        )
    run_dirs = {resolved: run_dir for resolved, (run_dir, _) in sweep.named.items()}
    for child in sorted(path.iterdir()):
        resolved = child.resolve()
        if not (child / METRICS_FILE).is_file() or resolved in sweep.failed:
            continue
        if sweep.lists_runs and resolved not in run_dirs:
            # e.g. a run of an earlier sweep with other worker counts: not this sweep's point
            logger.warning(
                "%s: skipping %s: not one of the runs %s lists (pass it alone to report it)",
                path,
                child.name,
                sweep.file.name,
            )
            continue
        run_dirs.setdefault(resolved, child)
    if not run_dirs and sweep.lists_runs:
        raise ReportError(
            f"{sweep.file}: lists no finished run yet; wait for `landcover scale` to finish a "
            "run, or pass run directories written by `landcover train --out`"
        )
    if not run_dirs:
        raise ReportError(
            f"{path}: no {METRICS_FILE} in it nor in any subdirectory; pass run directories "
            "written by `landcover train --out` (or a sweep directory holding them)"
        )
    return [_Source(run_dir, sweep) for run_dir in run_dirs.values()]


def _load_sweep(sweep_dir: Path) -> _Sweep:
    sweep_file = sweep_dir / SWEEP_FILE
    named: dict[Path, tuple[Path, SweepRun]] = {}
    unnamed: list[SweepRun] = []
    failed: dict[Path, SweepRun] = {}
    if not sweep_file.is_file():
        return _Sweep(sweep_file, named, (), failed, None)
    record = read_sweep(sweep_file)
    raw = _read_json(sweep_file)
    current_form = isinstance(raw, dict) and "format" in raw
    for run in record.runs:
        if run.run_dir is None:
            if run.status != "failed":
                unnamed.append(run)
            continue
        # relative to the sweep directory, as the sweep writes it
        run_dir = sweep_dir / run.run_dir
        if run.status == "failed":
            failed[run_dir.resolve()] = run
        else:
            named.setdefault(run_dir.resolve(), (run_dir, run))
    lists_runs = current_form and not unnamed
    return _Sweep(sweep_file, named, tuple(unnamed), failed, record.epochs, lists_runs)


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    return parse_json(text, where=str(path), fix="restore it or delete it", error=ReportError)


def _summarise(source: _Source) -> RunSummary:
    records = read_epoch_records(source.run_dir / METRICS_FILE)
    first = records[0]
    used = steady_epochs(records)
    workers = first.world_size
    nodes = first.nodes or 1
    threads = first.threads_per_worker
    entry = source.sweep.entry_for(source.run_dir, workers)
    run_info = _read_run_info(source.run_dir / RUN_FILE)
    epochs_planned = run_info.epochs_planned or source.sweep.epochs
    cores = _positive_int(entry and entry.cores) or run_info.cores
    oversubscribed, oversubscribed_source = _oversubscription(
        entry, cores=cores, workers=workers, nodes=nodes, threads_per_worker=threads
    )
    # what an epoch trained (full batches only: 1 and 8 workers can train different counts)
    samples = [r.samples_trained_per_s * r.epoch_time_s for r in used]
    return RunSummary(
        run_dir=source.run_dir,
        device=first.device,
        compression=first.compression,
        block_momentum=first.block_momentum,
        model=first.model,
        batch_size=first.batch_size,
        workers=workers,
        nodes=nodes,
        threads_per_worker=threads,
        epochs=tuple(r.epoch for r in records),
        epochs_used=tuple(r.epoch for r in used),
        epoch_times_s=tuple(r.epoch_time_s for r in records),
        epoch_time_s=steady_epoch_time_s(records),
        load_time_s=max(r.load_time_s for r in records),
        steps=round(statistics.median(r.steps for r in used)),
        # The store's training chips (run.json) are the epoch's S; the samples a run trained
        # (steps × workers × batch) undercount it by the dropped remainder.
        samples_per_epoch=run_info.train_chips or max(1, round(statistics.median(samples))),
        samples_per_s=steady_samples_per_s(records),
        comm_bytes_per_step=statistics.median(r.comm_bytes_per_step for r in used),
        comm_counts=median_counts([r.comm_counts() for r in used]),
        comm_time_s=_median_or_none([r.comm_time_s for r in used]),
        vm_size=run_info.vm_size,
        cores=cores,
        oversubscribed=oversubscribed,
        oversubscribed_source=oversubscribed_source,
        store=run_info.store_url,
        epochs_planned=epochs_planned,
        stopped_early=_stopped_early(records, run_info.patience, epochs_planned),
        store_digest=_store_text(run_info, "digest"),
        chip_size_px=_chip_size_px(run_info),
        amp=run_info.amp,
    )


def median_counts(counts: Sequence[CommCounts]) -> CommCounts:
    """Field by field medians of `counts` (measured only if all were)."""
    values = {
        f.name: statistics.median(getattr(c, f.name) for c in counts)
        for f in fields(CommCounts)
        if f.name != "measured"
    }
    return CommCounts(**values, measured=all(c.measured for c in counts))


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _read_run_info(path: Path) -> RunInfo:
    """run.json as RunInfo; a missing file or one that is not an object says nothing."""
    data = _read_json(path) if path.is_file() else {}
    return RunInfo.model_validate(data if isinstance(data, dict) else {})


def _oversubscription(
    entry: SweepRun | None,
    *,
    cores: int | None,
    workers: int,
    nodes: int,
    threads_per_worker: int | None,
) -> tuple[bool | None, str | None]:
    """Whether a run's workers asked for more threads than a host has cores, and who says so:
    the sweep's own mark first, else workers per host × threads against the core count."""
    if entry is not None and entry.oversubscribed is not None:
        return entry.oversubscribed, SWEEP_FILE
    if cores is None or threads_per_worker is None:
        return None, None
    workers_per_host = math.ceil(workers / nodes)
    return (
        workers_per_host * threads_per_worker > cores,
        f"workers×threads {workers_per_host}×{threads_per_worker} vs {cores} cores",
    )


def _stopped_early(
    records: list[EpochRecord], patience: int | None, epochs_planned: int | None
) -> bool:
    """Whether the trainer's --patience rule ended the run after its last recorded epoch:
    `patience` epochs in a row without a val mIoU above the best so far (a NaN, recorded as
    null, never improves), before the planned last epoch. The rule is replayed, not read,
    because metrics.jsonl does not record the stop."""
    if patience is None or epochs_planned is None:
        return False
    best, without_gain = -math.inf, 0
    for record in records:
        miou = record.val_miou
        if miou is not None and miou > best:
            best, without_gain = miou, 0
        else:
            without_gain += 1
    last = records[-1].epoch
    return without_gain >= patience and last < epochs_planned


def _store_text(run_info: RunInfo, key: str) -> str | None:
    """A non-empty string of run.json's `store` object (e.g. its digest), else None."""
    value = (run_info.store or {}).get(key)
    return value if isinstance(value, str) and value else None


def _chip_size_px(run_info: RunInfo) -> int | None:
    """The chip size of the store a run trained on (run.json's store summary), else None."""
    summary = (run_info.store or {}).get("summary")
    return _positive_int(summary.get("chip_size")) if isinstance(summary, dict) else None


def _positive_int(value: Any) -> int | None:
    return value if is_int(value) and value > 0 else None
