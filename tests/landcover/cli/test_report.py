"""`landcover report scaling` and the table of `landcover scale` through the CLI: no report
joins runs that are not points of one experiment (other per-worker resources, or runs of an
earlier sweep that its sweep.json does not list).

Launches are the stand-in of tests/landcover/scaling/test_sweep.py (metrics.jsonl written as a
run would, with the --threads each run got), so every command runs in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.scaling import sweep
from tests.landcover.scaling.runfiles import write_run
from tests.support.sweeps import FakeLaunch

STAND_IN = "tests.cluster.fake_worker"  # never started: the launch is FakeLaunch


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _scale(out: Path, workers: str, *extra: str) -> str:
    return _invoke(
        "scale", "chips.zarr", "--workers", workers, "--epochs", "2", "--out", str(out),
        "--entry-module", STAND_IN, *extra,
    )  # fmt: skip


def _report_curves(stdout: str) -> dict[tuple[str, str], set[str]]:
    """(device, curve) → the threads/worker of its runs, from the report's runs table."""
    lines = stdout.split("## Measured runs", 1)[1].split("\n\n")[1].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    curves: dict[tuple[str, str], set[str]] = {}
    for line in lines[2:]:
        row = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        curves.setdefault((row["device"], row["mode"]), set()).add(row["threads/worker"])
    return curves


def _scale_table_threads(stdout: str) -> dict[tuple[str, str], set[str]]:
    """The scale table is one curve: its threads column."""
    rows = [line.split() for line in stdout.splitlines()[1:] if line[:1] == " "]
    return {("sweep", "table"): {row[4] for row in rows}}


def _report_after_an_overwrite_with_fewer_workers(tmp_path: Path) -> dict[Any, set[str]]:
    # the report: workers-2 of the first sweep (1 thread each) stayed beside the
    # overwriting sweep's workers-1 (2 threads) and joined its curve
    out = tmp_path / "sweep"
    _scale(out, "1,2")
    _scale(out, "1", "--overwrite")
    return _report_curves(_invoke("report", "scaling", str(out), "--out", str(tmp_path / "r")))


def _report_of_run_dirs(tmp_path: Path) -> dict[Any, set[str]]:
    one = write_run(tmp_path, "a", workers=1, epoch_times=[30.0, 10.0], threads_per_worker=2)
    two = write_run(tmp_path, "b", workers=2, epoch_times=[30.0, 20.0], threads_per_worker=1)
    stdout = _invoke("report", "scaling", str(one), str(two), "--out", str(tmp_path / "r"))
    return _report_curves(stdout)


def _scale_rerun_with_more_worker_counts(tmp_path: Path) -> dict[Any, set[str]]:
    # 1,2 gets 2 threads per worker on 4 cores, 1,2,4 gets 1: a rerun must not reuse the
    # 2-thread runs beside its own 1-thread one
    out = tmp_path / "sweep"
    _scale(out, "1,2")
    return _scale_table_threads(_scale(out, "1,2,4"))


@pytest.mark.parametrize(
    "command",
    [
        _report_after_an_overwrite_with_fewer_workers,
        _report_of_run_dirs,
        _scale_rerun_with_more_worker_counts,
    ],
    ids=["report scaling SWEEP", "report scaling RUN_DIRS", "scale"],
)
def test_no_report_joins_runs_with_other_threads_per_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: Callable[[Path], dict[Any, set[str]]],
) -> None:
    cores = 2 if command is _report_after_an_overwrite_with_fewer_workers else 4
    monkeypatch.setattr(sweep, "local_cpu_count", lambda: cores)
    monkeypatch.setattr("tiling.runtime.machine.local_cpu_count", lambda: cores)
    monkeypatch.setattr(sweep, "launch_plan", FakeLaunch())
    curves = command(tmp_path)
    assert curves
    for curve, threads in curves.items():
        assert len(threads) == 1, f"{curve} joins runs of {sorted(threads)} threads per worker"
