"""sweep.json as a typed record: what is written is read back, older forms are migrated in
one place, and a bad file is one line naming it and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from landcover.errors import ReportError
from landcover.scaling.sweepfile import (
    SWEEP_FORMAT,
    SWEEP_VERSION,
    SweepRecord,
    SweepRun,
    migrate,
    read_sweep,
    write_launch,
    write_sweep,
)


def sweep_run(workers: int, **fields: Any) -> SweepRun:
    values: dict[str, Any] = {
        "workers": workers,
        "nodes": 1,
        "processes_per_node": workers,
        "threads_per_worker": 1,
        "cores": 2,
        "oversubscribed": workers > 2,
        "run_dir": f"workers-{workers}",
        "status": "done",
        "error": None,
        "job_id": f"job-{workers}",
        "log_dir": f"workers-{workers}/logs",
        "wall_time_s": 12.5,
        "epochs_done": 3,
        "epoch_time_s": 4.0,
        "samples_per_s": 250.0,
    }
    return SweepRun(**{**values, **fields})


def sweep_record(*runs: SweepRun) -> SweepRecord:
    return SweepRecord(
        engine="local",
        cluster="local",
        vm_size="local",
        host="box",
        cores=2,
        store="chips.zarr",
        epochs=3,
        train_args=("--model", "small_unet"),
        entry_module="landcover.training",
        created="2026-01-01T00:00:00+00:00",
        updated=None,
        runs=runs,
    )


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    record = sweep_record(sweep_run(1), sweep_run(4, status="failed", error="out of memory"))
    path = tmp_path / "sweep.json"
    write_sweep(path, record)
    assert read_sweep(path) == record
    document = json.loads(path.read_text())
    assert (document["format"], document["version"]) == (SWEEP_FORMAT, SWEEP_VERSION)
    assert list(document) == [*SweepRecord.model_fields]  # every field, in order, null or not
    assert document["updated"] is None and document["train_args"] == ["--model", "small_unet"]
    assert list(document["runs"][0]) == [*SweepRun.model_fields]
    assert not list(tmp_path.glob(".*"))  # the atomic write left no temp file
    write_launch(tmp_path, record.runs[1])
    assert SweepRun(**json.loads((tmp_path / "launch.json").read_text())) == record.runs[1]


def test_a_run_is_one_readable_phrase() -> None:
    failed = sweep_run(2, status="failed", error="killed: out of memory\ntraceback")
    assert failed.describe() == "workers-2 (2 workers, status failed): killed: out of memory"
    assert sweep_run(1, run_dir=None).describe() == "a run (1 workers, status done)"


def test_files_without_a_format_are_migrated(tmp_path: Path) -> None:
    # a bare list of runs, named or not, with an exit code or a word for a failure
    path = tmp_path / "sweep.json"
    path.write_text(
        json.dumps(
            [
                {"workers": 1, "oversubscribed": False},
                {"workers": 2, "run_dir": "w2", "returncode": 1},
                {"workers": 4, "run_dir": "w4", "status": "crashed", "error": "oom"},
                {"workers": 8, "run_dir": "w8", "status": "done", "cores": 2, "extra": "x"},
            ]
        )
    )
    record = read_sweep(path)
    assert (record.format, record.version, record.epochs, record.train_args) == (
        SWEEP_FORMAT,
        SWEEP_VERSION,
        None,
        (),
    )
    first, second, third, fourth = record.runs
    assert (first.run_dir, first.status, first.oversubscribed, first.nodes) == (
        None,
        "done",
        False,
        None,
    )
    assert (second.status, second.error) == ("failed", "exit code 1")
    assert (third.status, third.error) == ("failed", "oom")
    assert (fourth.status, fourth.cores, fourth.oversubscribed) == ("done", 2, None)
    # {"runs": [...]} with some of the header
    path.write_text(json.dumps({"epochs": 12, "runs": []}))
    assert (read_sweep(path).epochs, read_sweep(path).runs) == (12, ())


def test_the_current_version_passes_the_migration_unchanged() -> None:
    document = sweep_record(sweep_run(1)).model_dump(mode="json")
    assert migrate(document) is document


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"not valid JSON \(.* at line 1 column 2\)"),
        ('{"runs": {"workers": 1}}', r"expected a list of run objects"),
        (
            '{"format": "landcover-sweep", "version": 2, "runs": []}',
            r"format 'landcover-sweep' version 2 is not 'landcover-sweep' version 1",
        ),
        ('[{"workers": 0}]', r"runs\.0\.workers: Input should be greater than or equal to 1"),
        ('[{"workers": 1, "status": "done", "cores": "two"}]', r"runs\.0\.cores: .*'two'"),
    ],
)
def test_a_bad_file_is_one_line_naming_it_and_the_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=message) as info:
        read_sweep(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "rerun `landcover scale` with --overwrite to replace it, or delete it" in str(info.value)
    assert "\n" not in str(info.value)
