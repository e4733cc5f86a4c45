"""Scaling sweeps: worker counts, specs per point, sweep.json, reuse and the table.

Launches are replaced by a stand-in that writes metrics.jsonl the way a run would, so the
sweep's bookkeeping is tested in milliseconds; a real sweep runs in
tests/landcover/cli/test_cluster.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from cluster.clusterjson import parse_cluster_spec
from cluster.engine import Job, LaunchOptions, LaunchResult, Plan
from cluster.errors import ClusterError
from landcover.scaling import sweep
from landcover.scaling.runs import load_runs
from landcover.scaling.sweep import (
    SWEEP_RERUN_MAY_CHANGE,
    SWEEP_RERUN_MUST_MATCH,
    SweepConfig,
    SweepResult,
    SweepRun,
    format_sweep_table,
    parse_worker_counts,
    run_sweep,
    spec_for_workers,
    summarize_metrics,
)
from tests.landcover.scaling.runfiles import metrics_line, write_run
from tests.support.sweeps import FakeLaunch


def test_worker_counts() -> None:
    assert parse_worker_counts("4, 1,2,2") == (1, 2, 4)
    with pytest.raises(ClusterError, match=r"'x' is not a whole number; give e.g. 1,2,4"):
        parse_worker_counts("1,x")
    with pytest.raises(ClusterError, match="worker counts must be >= 1, got 0"):
        parse_worker_counts("0,1")
    with pytest.raises(ClusterError, match="--workers is empty"):
        parse_worker_counts(" , ")


def test_spec_per_worker_count() -> None:
    assert spec_for_workers(None, 3).node_count == 1
    assert spec_for_workers(None, 3).processes_per_node == 3
    gpu = parse_cluster_spec(
        {
            "targetNodeCount": 2,
            "vmSize": "Standard_NC24s_v3",
            "engine": "kubernetes",
            "kubernetes": {"image": "i"},
            "elastic": {"minNodes": 1, "maxNodes": 4, "maxRestarts": 2},
        }
    )
    eight = spec_for_workers(gpu, 8)
    assert (eight.node_count, eight.processes_per_node, eight.elastic) == (2, 4, eight.elastic)
    assert eight.elastic is not None and (eight.elastic.min_nodes, eight.elastic.max_nodes) == (
        2,
        2,
    )
    assert eight.elastic.max_restarts == 2
    assert spec_for_workers(gpu, 2).node_count == 1  # fewer than one node's GPUs
    with pytest.raises(
        ClusterError, match=r"6 workers is not a multiple of processesPerNode \(4\)"
    ):
        spec_for_workers(gpu, 6)


def test_metrics_summary(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [metrics_line(e, 1, t, samples_per_s=10 / t) for e, t in [(1, 3.0), (2, 1.0), (3, 2.0)]]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"epoch": 4, "epo')
    # the warm-up epoch 1 is left out: medians of epochs 2 and 3; the torn line is skipped
    assert summarize_metrics(path) == (3, 1.5, 7.5)
    assert summarize_metrics(tmp_path / "none.jsonl") == (0, None, None)


def test_the_sweep_table_and_the_report_agree_on_epoch_time(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, "r", workers=2, epoch_times=[30.0, 10.0, 12.0, 20.0])
    (report,) = load_runs([run_dir])
    epochs, epoch_time_s, samples_per_s = summarize_metrics(run_dir / "metrics.jsonl")
    assert (epochs, epoch_time_s, samples_per_s) == (
        len(report.epochs),
        report.epoch_time_s,
        report.samples_per_s,
    )
    assert epoch_time_s == 12.0  # epochs 2-4: the warm-up epoch counts in neither


def test_sweep_records_runs_reuses_them_and_marks_oversubscription(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 2)
    fake = FakeLaunch(fail_at=8)
    monkeypatch.setattr(sweep, "launch_plan", fake)
    config = SweepConfig(
        store="chips.zarr",
        workers=(1, 2, 4, 8),
        epochs=2,
        out_dir=str(tmp_path / "sweep"),
        extra_args=("--model", "small_unet"),
    )
    seen: list[int] = []
    result = run_sweep(config, on_run=lambda run: seen.append(run.workers))
    assert seen == fake.calls == [1, 2, 4, 8]
    document = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert document["format"] == "landcover-sweep" and document["version"] == 1
    assert (document["engine"], document["cores"], document["epochs"]) == ("local", 2, 2)
    assert document["train_args"] == ["--model", "small_unet"]
    runs = {r["workers"]: r for r in document["runs"]}
    assert [runs[w]["oversubscribed"] for w in (1, 2, 4, 8)] == [False, False, True, True]
    assert runs[2] == {
        "workers": 2,
        "nodes": 1,
        "processes_per_node": 2,
        "threads_per_worker": runs[2]["threads_per_worker"],
        "cores": 2,
        "oversubscribed": False,
        "run_dir": "workers-2",
        "status": "done",
        "error": None,
        "job_id": "job-2",
        "log_dir": "workers-2/logs",
        "wall_time_s": runs[2]["wall_time_s"],
        "epochs_done": 2,
        "epoch_time_s": 4.0,
        "samples_per_s": 20.0,
    }
    assert runs[8]["status"] == "failed" and "exit code 1" in runs[8]["error"]
    assert runs[8]["epoch_time_s"] is None
    assert json.loads((tmp_path / "sweep" / "workers-4" / "launch.json").read_text()) == runs[4]
    assert [r.workers for r in result.failed] == [8]

    # a rerun redoes only what did not finish, after clearing its half-written dir
    (tmp_path / "sweep" / "workers-8" / "stale").write_text("x")
    fake.fail_at = None
    run_sweep(config)
    assert fake.calls == [1, 2, 4, 8, 8]
    assert not (tmp_path / "sweep" / "workers-8" / "stale").exists()
    # other settings in the same directory are refused, unless overwriting
    with pytest.raises(ClusterError, match=r"other settings \(--epochs 2 \(now 3\)\)"):
        run_sweep(replace(config, epochs=3))
    run_sweep(
        replace(config, epochs=3, overwrite=True, workers=(1,), extra_args=("--threads", "3"))
    )
    assert fake.calls[-1] == 1
    rerun = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["workers"], r["threads_per_worker"]) for r in rerun["runs"]] == [(1, 3)]


def test_the_report_reads_what_the_sweep_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 2)
    monkeypatch.setattr(sweep, "launch_plan", FakeLaunch(fail_at=8))
    result = run_sweep(SweepConfig("chips.zarr", (1, 2, 4, 8), 3, str(tmp_path / "sweep")))
    assert [result.run_path(r) for r in result.runs[:2]] == [
        tmp_path / "sweep" / "workers-1",
        tmp_path / "sweep" / "workers-2",
    ]
    runs = sorted(load_runs([tmp_path / "sweep"]), key=lambda r: r.workers)
    # the failed 8-worker run is left out; cores, oversubscription and planned epochs are
    # the sweep's (the runs have no run.json)
    assert [
        (r.workers, r.run_dir.name, r.cores, r.oversubscribed, r.oversubscribed_source, r.progress)
        for r in runs
    ] == [
        (1, "workers-1", 2, False, "sweep.json", "3 of 3"),
        (2, "workers-2", 2, False, "sweep.json", "3 of 3"),
        (4, "workers-4", 2, True, "sweep.json", "3 of 3"),
    ]


def test_overwrite_with_fewer_worker_counts_leaves_only_the_new_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the report: `scale --workers 1,2` then `scale --workers 1 --overwrite` left
    # workers-2 (1 thread per worker) beside the new workers-1 (2 threads), and the report
    # fitted the two: efficiency 23 %
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 2)
    monkeypatch.setattr("tiling.runtime.machine.local_cpu_count", lambda: 2)
    monkeypatch.setattr(sweep, "launch_plan", FakeLaunch())
    out = tmp_path / "sweep"
    config = SweepConfig("chips.zarr", (1, 2), 2, str(out))
    run_sweep(config)
    (out / "notes.txt").write_text("mine")  # the user's: not a run of the sweep
    (out / "workers-8").mkdir()  # not recorded by the sweep: left alone
    run_sweep(replace(config, workers=(1,), overwrite=True))
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt",
        "sweep.json",
        "workers-1",
        "workers-8",
    ]
    document = json.loads((out / "sweep.json").read_text())
    assert [(r["workers"], r["threads_per_worker"]) for r in document["runs"]] == [(1, 2)]
    assert [(r.workers, r.threads_per_worker) for r in load_runs([out])] == [(1, 2)]


def test_a_rerun_reuses_only_runs_of_the_same_per_worker_resources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,2 on 4 cores gives 2 threads per worker; 1,2,4 gives 1: the old 1 and 2 are not
    # points of the new sweep, and reusing them would mix thread counts in one table
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 4)
    monkeypatch.setattr("tiling.runtime.machine.local_cpu_count", lambda: 4)
    fake = FakeLaunch()
    monkeypatch.setattr(sweep, "launch_plan", fake)
    config = SweepConfig("chips.zarr", (1, 2), 2, str(tmp_path / "sweep"))
    run_sweep(config)
    run_sweep(config)  # the same sweep again: both runs reused
    result = run_sweep(replace(config, workers=(1, 2, 4)))
    assert fake.calls == [1, 2, 1, 2, 4]
    assert {r.threads_per_worker for r in result.runs} == {1}


@pytest.mark.parametrize(
    ("extra_args", "flag"),
    [
        (("--out", "x"), "--out"),
        (("--out=x",), "--out"),
        (("--epochs", "2"), "--epochs"),
        (("--nproc", "2"), "--nproc"),
    ],
)
def test_reserved_training_args_are_refused(
    tmp_path: Path, extra_args: tuple[str, ...], flag: str
) -> None:
    config = SweepConfig("s", (1,), 1, str(tmp_path), extra_args=extra_args)
    with pytest.raises(ClusterError, match=f"{flag} is set by the sweep"):
        run_sweep(config)


def run(workers: int, epoch_time_s: float | None, **fields: Any) -> SweepRun:
    values: dict[str, Any] = {
        "workers": workers,
        "nodes": 1,
        "processes_per_node": workers,
        "threads_per_worker": max(1, 2 // workers),
        "cores": 2,
        "oversubscribed": workers > 2,
        "run_dir": f"workers-{workers}",
        "status": "done",
        "error": None,
        "job_id": None,
        "log_dir": None,
        "wall_time_s": 1.0,
        "epochs_done": 1,
        "epoch_time_s": epoch_time_s,
        "samples_per_s": None if epoch_time_s is None else 100 / epoch_time_s,
    }
    values.update(fields)
    return SweepRun(**values)


def test_table_of_epoch_time_against_workers(tmp_path: Path) -> None:
    result = SweepResult(
        tmp_path / "sweep.json",
        2,
        (run(1, 10.0), run(2, 6.25), run(4, 5.0), run(8, None, status="failed")),
    )
    assert format_sweep_table(result).splitlines() == [
        "workers  nodes x procs  threads  epoch time (s)  samples/s  speedup  efficiency  note",
        "      1          1 x 1        2          10.000       10.0     1.00        100%",
        "      2          1 x 2        1           6.250       16.0     1.60         80%",
        "      4          1 x 4        1           5.000       20.0     2.00         50%  "
        "oversubscribed (4 workers > 2 cores)",
        "      8          1 x 8        1               -          -        -           -  "
        "failed; oversubscribed (8 workers > 2 cores)",
    ]


def test_repeated_worker_counts_share_their_speedup_in_the_table(tmp_path: Path) -> None:
    # the second run at 2 workers was measured faster than the first: relative to the first
    # run it read as over 100 % efficiency
    runs = (run(2, 10.0), run(2, 8.0), run(4, 6.0), run(4, 5.0))
    table = format_sweep_table(SweepResult(tmp_path / "sweep.json", 2, runs)).splitlines()
    speedups = [line.split()[7] for line in table[1:]]  # "1 x 2" is three words
    efficiencies = [line.split()[8] for line in table[1:]]
    assert speedups[0] == speedups[1] == "1.00"
    assert speedups[2] == speedups[3]
    assert max(int(e.rstrip("%")) for e in efficiencies) == 100


def test_secret_environment_reaches_every_run_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "c3dlZXAtc2VjcmV0LWtleQ=="
    storage_options = json.dumps({"account_key": key})
    secret_env = {"LANDCOVER_STORAGE_OPTIONS": storage_options}
    jobs: list[Job] = []
    fake = FakeLaunch()

    def launch(plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
        jobs.append(plan.job)
        return fake(plan, options)

    monkeypatch.setattr(sweep, "launch_plan", launch)
    config = SweepConfig(
        "chips.zarr",
        (1, 2),
        1,
        str(tmp_path / "sweep"),
        ("--lr", "0.01", "--storage-options", storage_options),
    )
    assert key not in repr(config)
    run_sweep(config)
    assert [dict(job.secret_env) for job in jobs] == [secret_env, secret_env]
    assert all(key not in " ".join(job.argv) for job in jobs)
    assert all("--lr" in job.argv for job in jobs)
    for path in (tmp_path / "sweep").rglob("*"):
        assert path.is_dir() or key not in path.read_text()


class ArgvLaunch(FakeLaunch):
    """FakeLaunch that also keeps each run's worker argv."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: dict[int, tuple[str, ...]] = {}

    def __call__(self, plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
        self.argvs[plan.spec.workers] = tuple(plan.job.argv)
        return super().__call__(plan, options)


def _threads_of(argv: tuple[str, ...]) -> int:
    return int(argv[argv.index("--threads") + 1])


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(2, (1, 2), 1), (8, (1, 2, 4), 2), (2, (1, 2, 4), 1), (16, (1,), 16)],
)
def test_every_point_of_a_sweep_gets_the_threads_of_its_largest_worker_count(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cores: int,
    workers: tuple[int, ...],
    threads: int,
) -> None:
    # `landcover scale STORE --workers 1,2` on 2 cores: 1 thread per worker at both points,
    # so the second worker adds a core instead of splitting the first worker's two
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: cores)
    monkeypatch.setattr("tiling.runtime.machine.local_cpu_count", lambda: cores)
    fake = ArgvLaunch()
    monkeypatch.setattr(sweep, "launch_plan", fake)
    run_sweep(SweepConfig("chips.zarr", workers, 3, str(tmp_path / "sweep")))
    assert {n: _threads_of(argv) for n, argv in fake.argvs.items()} == dict.fromkeys(
        workers, threads
    )
    document = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["threads_per_worker"], r["cores"]) for r in document["runs"]] == [
        (threads, cores)
    ] * len(workers)


def test_threads_given_to_a_sweep_are_kept_at_every_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 2)
    fake = ArgvLaunch()
    monkeypatch.setattr(sweep, "launch_plan", fake)
    config = SweepConfig("chips.zarr", (1, 2), 1, str(tmp_path / "s"), ("--threads", "2"))
    result = run_sweep(config)
    assert [_threads_of(fake.argvs[n]) for n in (1, 2)] == [2, 2]
    # 2 workers × 2 threads on 2 cores: time-slicing, marked
    assert [r.oversubscribed for r in result.runs] == [False, True]


def test_table_efficiency_is_from_samples_per_second_not_epoch_time(tmp_path: Path) -> None:
    # 1003 chips, batch 8: 1 worker trains 125 full batches (1000 samples) in 10 s; 8 workers
    # train 15 batches each (960 samples) in 1.2 s. Epoch times say 104 %; the equal-work
    # rate (samples/s) says 100 %.
    runs = (run(1, 10.0, samples_per_s=100.0), run(8, 1.2, samples_per_s=800.0))
    table = format_sweep_table(SweepResult(tmp_path / "sweep.json", 8, runs))
    assert table.splitlines()[2].split()[7:9] == ["8.00", "100%"]


def test_every_sweep_option_is_one_a_rerun_may_change_or_one_it_must_keep() -> None:
    """A new SweepConfig field fails here until it is put in one of the two."""
    names = sorted(f.name for f in fields(SweepConfig))
    assert sorted(SWEEP_RERUN_MAY_CHANGE + SWEEP_RERUN_MUST_MATCH) == names


LAB = parse_cluster_spec(
    {"name": "lab", "engine": "local", "vmSize": "local", "targetNodeCount": 1}
)
# Each SweepConfig field changed on a rerun, and the refusal's words (None: the rerun goes on).
SWEEP_CHANGES: dict[str, tuple[dict[str, Any], str | None]] = {
    "store": ({"store": "other.zarr"}, "STORE chips.zarr (now other.zarr)"),
    "workers": ({"workers": (1,)}, None),
    "epochs": ({"epochs": 3}, "--epochs 2 (now 3)"),
    "out_dir": ({"out_dir": "moved"}, None),
    "extra_args": (
        {"extra_args": ("--batch-size", "4")},
        "training arguments [--batch-size 8] (now [--batch-size 4])",
    ),
    "cluster": ({"cluster": LAB}, "--cluster-json cluster local (now lab)"),
    "entry_module": ({"entry_module": "stand.in"}, "--entry-module landcover.training (now "),
    "overwrite": ({"overwrite": True}, None),
}


@pytest.mark.parametrize("name", [f.name for f in fields(SweepConfig)])
def test_a_rerun_refuses_or_takes_each_changed_sweep_option(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert name in SWEEP_CHANGES, f"say what a sweep rerun with another {name} does"
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: 2)
    monkeypatch.setattr("tiling.runtime.machine.local_cpu_count", lambda: 2)
    monkeypatch.setattr(sweep, "launch_plan", FakeLaunch())
    out = tmp_path / "sweep"
    config = SweepConfig("chips.zarr", (1,), 2, str(out), extra_args=("--batch-size", "8"))
    run_sweep(config)
    change, words = SWEEP_CHANGES[name]
    if "out_dir" in change:
        change = {"out_dir": str(tmp_path / change["out_dir"])}
        shutil.copytree(out, change["out_dir"])
    rerun = replace(config, **change)
    if words is None:
        assert name in SWEEP_RERUN_MAY_CHANGE
        assert [r.status for r in run_sweep(rerun).runs] == ["done"]
        return
    assert name in SWEEP_RERUN_MUST_MATCH
    with pytest.raises(ClusterError) as info:
        run_sweep(rerun)
    message = str(info.value)
    assert message.startswith(f"{out} holds a sweep with other settings ({words}")
    assert message.endswith("pass --overwrite to replace it or choose another --out")
