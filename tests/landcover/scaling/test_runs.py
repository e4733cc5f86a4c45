"""Reading run directories: epoch time without warm-up, sweeps, oversubscription, run.json,
and one clear line for every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from landcover.errors import ReportError
from landcover.scaling.runs import load_runs
from landcover.scaling.sweepfile import SweepRecord, migrate, write_sweep
from tests.landcover.scaling.runfiles import (
    BATCH,
    SAMPLES,
    metrics_line,
    only,
    power_law_runs,
    steps_for,
    write_run,
)


def test_epoch_time_is_the_median_without_the_warm_up_epoch(tmp_path: Path) -> None:
    four = write_run(tmp_path, "a", workers=1, epoch_times=[50.0, 10.0, 12.0, 11.0])
    one = write_run(tmp_path, "b", workers=2, epoch_times=[7.0])
    two = write_run(tmp_path, "c", workers=4, epoch_times=[9.0, 4.0])
    runs = load_runs([four, one, two])
    assert only(runs, 1).epoch_time_s == 11.0
    assert only(runs, 1).epochs_used == (2, 3, 4)
    assert only(runs, 2).epoch_time_s == 7.0  # a single epoch is all there is
    assert only(runs, 4).epoch_time_s == 4.0
    assert only(runs, 4).epochs_used == (2,)
    assert only(runs, 4).samples_per_epoch == SAMPLES


def test_a_resumed_run_keeps_the_last_record_of_each_epoch(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "r", workers=2, epoch_times=[30.0, 10.0, 10.0])
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps(metrics_line(3, 2, 20.0)) + "\n\n")
    (run,) = load_runs([run_dir])
    assert run.epochs == (1, 2, 3)
    assert run.epoch_time_s == 15.0  # median of epochs 2 and 3 = (10 + 20) / 2


def test_a_sweep_directory_and_one_of_its_runs_give_each_run_once(tmp_path: Path) -> None:
    power_law_runs(tmp_path / "sweep", [1, 2, 4])
    runs = load_runs([tmp_path / "sweep", tmp_path / "sweep" / "w2"])
    assert sorted(r.workers for r in runs) == [1, 2, 4]


# --- oversubscription and run.json ----------------------------------------------------------


def test_sweep_entries_without_a_path_match_by_worker_count(tmp_path: Path) -> None:
    power_law_runs(tmp_path, [1, 2])
    (tmp_path / "sweep.json").write_text(
        json.dumps(
            [{"workers": 1, "oversubscribed": False}, {"workers": 2, "oversubscribed": True}]
        )
    )
    runs = load_runs([tmp_path])
    assert only(runs, 2).oversubscribed is True
    assert only(runs, 1).oversubscribed is False


def test_oversubscription_is_inferred_from_run_json_cores(tmp_path: Path) -> None:
    host = {"host": "box", "cores": 4}
    fits = write_run(
        tmp_path, "fits", workers=2, epoch_times=[1.0], threads_per_worker=2, run_json=host
    )
    over = write_run(
        tmp_path, "over", workers=4, epoch_times=[1.0], threads_per_worker=2, run_json=host
    )
    two_nodes = write_run(
        tmp_path,
        "nodes",
        workers=8,
        epoch_times=[1.0],
        threads_per_worker=1,
        nodes=2,
        run_json=host,
    )
    unknown = write_run(tmp_path, "unknown", workers=16, epoch_times=[1.0])
    runs = {r.run_dir.name: r for r in load_runs([fits, over, two_nodes, unknown])}
    assert runs["fits"].oversubscribed is False
    assert runs["over"].oversubscribed is True  # 4 workers × 2 threads > 4 cores
    assert runs["over"].oversubscribed_source == "workers×threads 4×2 vs 4 cores"
    assert runs["nodes"].oversubscribed is False  # 4 workers per host × 1 thread
    assert runs["unknown"].oversubscribed is None


def test_run_json_gives_cores_and_the_cluster_vm_size(tmp_path: Path) -> None:
    cluster = {"vmSize": "Standard_NC24rs_v3", "engine": "azureml", "targetNodeCount": 2}
    full = write_run(
        tmp_path, "full", workers=2, epoch_times=[1.0], run_json={"cores": 8, "cluster": cluster}
    )
    # only the pinned keys count (docs/CONTRACTS.md, run directory): nothing nested elsewhere
    elsewhere = write_run(
        tmp_path,
        "elsewhere",
        workers=2,
        epoch_times=[1.0],
        run_json={"config": {"cluster": cluster}, "host": "box", "cpu_count": 8},
    )
    odd = write_run(
        tmp_path,
        "odd",
        workers=2,
        epoch_times=[1.0],
        run_json={"cores": "8", "cluster": "Standard_NC24rs_v3"},
    )
    runs = {r.run_dir.name: r for r in load_runs([full, elsewhere, odd])}
    assert (runs["full"].cores, runs["full"].vm_size) == (8, "Standard_NC24rs_v3")
    assert runs["full"].oversubscribed is False  # 2 workers × 1 thread on 8 cores
    for name in ("elsewhere", "odd"):
        run = runs[name]
        assert (run.cores, run.vm_size, run.oversubscribed) == (None, None, None), name


def test_runs_the_sweep_marks_failed_are_left_out(tmp_path: Path) -> None:
    power_law_runs(tmp_path, [1, 2, 4])
    entries = [
        {"workers": 1, "run_dir": "w1"},
        {"workers": 2, "run_dir": "w2", "status": "failed"},
        {"workers": 4, "run_dir": "w4", "returncode": 1},
        {"workers": 8, "run_dir": "w8", "status": "failed"},  # died before its first epoch
    ]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": entries}))
    assert [r.workers for r in load_runs([tmp_path])] == [1]


def test_a_sweep_directory_gives_only_the_runs_its_sweep_json_lists(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # workers-4 of an earlier sweep left beside the two runs the current sweep.json lists
    power_law_runs(tmp_path, [1, 2, 4])
    entries = [{"workers": n, "run_dir": f"w{n}", "status": "done"} for n in (1, 2)]
    write_sweep(tmp_path / "sweep.json", SweepRecord.model_validate(migrate({"runs": entries})))
    with caplog.at_level("WARNING", logger="landcover.scaling.runs"):
        runs = load_runs([tmp_path])
    assert sorted(r.workers for r in runs) == [1, 2]
    (message,) = [r.getMessage() for r in caplog.records]
    assert message == f"{tmp_path}: skipping w4: not one of the runs sweep.json lists " + (
        "(pass it alone to report it)"
    )
    # passed alone, it is read
    assert [r.workers for r in load_runs([tmp_path / "w4"])] == [4]
    # a sweep that has not finished a run yet says so
    write_sweep(tmp_path / "sweep.json", SweepRecord.model_validate(migrate({"runs": []})))
    with pytest.raises(ReportError, match=r"sweep\.json: lists no finished run yet"):
        load_runs([tmp_path])


# --- bad input -------------------------------------------------------------------------------


def _lines(run_dir: Path, *lines: str) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    return run_dir


def _line(**overrides: Any) -> str:
    record = metrics_line(1, 2, 10.0, **overrides)
    return json.dumps({k: v for k, v in record.items() if v is not ...})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", r"missing: no such directory; pass run directories"),
        (
            lambda p: (p / "empty-dir").mkdir() or p / "empty-dir",
            r"empty-dir: no metrics.jsonl in it nor in any subdirectory",
        ),
        (lambda p: _lines(p / "r"), r"metrics.jsonl: empty, no epoch has finished"),
        (
            lambda p: _lines(p / "r", _line(), '{"epoch": 2, "world_'),
            r"metrics.jsonl: line 2 is not valid JSON \(.*\); delete that line",
        ),
        (lambda p: _lines(p / "r", "[1, 2]"), r"line 1 is not a JSON object"),
        (
            lambda p: _lines(p / "r", _line(epoch_time_s=..., device=...)),
            r"line 1 lacks epoch_time_s, device; the report needs epoch, world_size",
        ),
        (
            lambda p: _lines(p / "r", _line(world_size="4")),
            r'line 1: world_size must be an integer >= 1, got "4"',
        ),
        (
            lambda p: _lines(p / "r", _line(epoch_time_s=0)),
            r"line 1: epoch_time_s must be a positive number, got 0",
        ),
        (
            lambda p: _lines(p / "r", _line(block_momentum="no")),
            r'line 1: block_momentum must be true or false, got "no"',
        ),
        (
            lambda p: _lines(p / "r", _line(), _line(epoch=2, world_size=4)),
            r"world_size changes between epochs \(2, 4\); one run directory must hold one",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(ReportError, match=message) as info:
        load_runs([make(tmp_path)])
    assert "\n" not in str(info.value)


def test_bad_run_json_and_sweep_json_are_named(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "a", "r", workers=1, epoch_times=[1.0])
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(ReportError, match=r"r/run.json: not valid JSON \(.*\); restore it"):
        load_runs([run_dir])
    sweep = tmp_path / "sweep"
    write_run(sweep, "w1", workers=1, epoch_times=[1.0])
    (sweep / "sweep.json").write_text(json.dumps({"runs": [{"run_dir": "w2", "workers": 2}]}))
    with pytest.raises(ReportError, match=r"w2: listed in .*sweep.json but has no metrics.jsonl"):
        load_runs([sweep])


# --- finished or not -------------------------------------------------------------------------


def _planned(epochs: int, patience: int | None = None, store: str = "chips.zarr") -> dict[str, Any]:
    """run.json as the trainer writes it, reduced to what the report reads."""
    return {
        "store": {"url": store},
        "config": {"store_url": store, "epochs": epochs, "patience": patience},
    }


def test_a_run_killed_before_its_last_epoch_is_incomplete(tmp_path: Path) -> None:
    killed = write_run(tmp_path, "killed", workers=8, epoch_times=[9.0, 1.0], run_json=_planned(30))
    done = write_run(tmp_path, "done", workers=1, epoch_times=[9.0, 5.0], run_json=_planned(2))
    unknown = write_run(tmp_path, "unknown", workers=2, epoch_times=[9.0, 3.0])
    runs = {r.run_dir.name: r for r in load_runs([killed, done, unknown])}
    assert (runs["killed"].complete, runs["killed"].progress) == (False, "2 of 30 (incomplete)")
    assert (runs["done"].complete, runs["done"].progress) == (True, "2 of 2")
    assert (runs["unknown"].complete, runs["unknown"].progress) == (None, "2 of ?")
    assert runs["done"].store == "chips.zarr" and runs["unknown"].store is None


def test_the_sweep_says_how_many_epochs_its_runs_planned(tmp_path: Path) -> None:
    power_law_runs(tmp_path, [1, 2])  # three epochs each
    (tmp_path / "sweep.json").write_text(json.dumps({"epochs": 12, "runs": []}))
    assert {r.progress for r in load_runs([tmp_path])} == {"3 of 12 (incomplete)"}


def test_an_early_stop_by_patience_is_complete(tmp_path: Path) -> None:
    # best mIoU at epoch 2, then two epochs without a gain: --patience 2 stops after epoch 4
    mious = [0.3, 0.5, 0.5, None]
    run_dir = write_run(
        tmp_path, "stopped", workers=1, epoch_times=[1.0] * 4, run_json=_planned(10, 2)
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for line, miou in zip(lines, mious, strict=True):
        line["val_miou"] = miou
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run,) = load_runs([run_dir])
    assert (run.stopped_early, run.complete, run.progress) == (True, True, "4 of 10 (early stop)")
    # with --patience 3 the same records are a run killed after epoch 4
    (run_dir / "run.json").write_text(json.dumps(_planned(10, 3)))
    (run,) = load_runs([run_dir])
    assert (run.stopped_early, run.complete) == (False, False)


def test_samples_per_second_without_the_field_comes_from_the_steps(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "r", workers=2, epoch_times=[4.0, 2.0], samples_per_s=None)
    (run,) = load_runs([run_dir])
    assert run.samples_per_s == pytest.approx(steps_for(2) * 2 * BATCH / 2.0)


def test_a_failed_sweep_run_is_logged_as_one_readable_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    power_law_runs(tmp_path, [1, 2])
    entries = [
        {"workers": 1, "run_dir": "w1", "status": "done"},
        {"workers": 2, "run_dir": "w2", "status": "failed", "error": "killed: out of memory\nmore"},
    ]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": entries}))
    with caplog.at_level("WARNING", logger="landcover.scaling.runs"):
        load_runs([tmp_path])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.endswith(
        "sweep.json: skipping a run the sweep marks as failed: "
        "w2 (2 workers, status failed): killed: out of memory"
    )
    assert "{" not in message and "\n" not in message


_COUNT_KEYS = (
    "comm_allreduce_per_step", "comm_allreduce_bytes_per_step", "comm_allgather_per_step",
    "comm_allgather_bytes_per_step", "comm_broadcast_per_step", "comm_broadcast_bytes_per_step",
    "comm_buckets_per_step",
)  # fmt: skip


@pytest.mark.parametrize(("compression", "gathered"), [("none", False), ("onebit", True)])
def test_collectives_of_older_files_are_inferred_from_the_bytes(
    tmp_path: Path, compression: str, gathered: bool
) -> None:
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    lines = []
    for epoch in (1, 2):
        line = metrics_line(epoch, 2, 10.0, compression=compression, comm_bytes_per_step=1e6)
        lines.append(json.dumps({k: v for k, v in line.items() if k not in _COUNT_KEYS}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run,) = load_runs([run_dir])
    counts = run.comm_counts
    assert not counts.measured
    assert counts.bytes_per_step == 1e6 and counts.collectives_per_step == 1
    assert (counts.allgather_bytes_per_step == 1e6) is gathered


def test_recorded_collectives_are_read_as_medians_of_the_steady_epochs(tmp_path: Path) -> None:
    run_dir = write_run(
        tmp_path, "psgd", workers=2, epoch_times=[3.0, 1.0, 1.0], compression="powersgd:2",
        comm_bytes_per_step=1e5, comm_allreduce_per_step=12.0,
        comm_allreduce_bytes_per_step=1e5, comm_buckets_per_step=4.0,
    )  # fmt: skip
    (run,) = load_runs([run_dir])
    assert run.comm_counts.measured
    assert (run.comm_counts.allreduce_per_step, run.comm_counts.buckets_per_step) == (12.0, 4.0)
    assert run.comm_time_s == 0.01
