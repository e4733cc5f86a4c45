"""Workers' one-line error records: written by the failing worker, the first one found."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.failures import (
    ERROR_DIR_ENV,
    clear_worker_errors,
    first_worker_error,
    record_worker_error,
)
from tiling.runtime.rankenv import RESTART_COUNT_ENV


def write_record(directory: Path, rank: int, attempt: int, time_s: float, message: str) -> None:
    record = {"rank": rank, "attempt": attempt, "time_s": time_s, "message": message}
    (directory / f"rank-{rank}.error").write_text(json.dumps(record))


def test_nothing_is_written_unless_a_launcher_asked(tmp_path: Path) -> None:
    assert record_worker_error("boom", rank=0, environ={}) is None
    assert list(tmp_path.iterdir()) == []


def test_the_record_is_one_line_of_the_failing_rank(tmp_path: Path) -> None:
    env = {ERROR_DIR_ENV: str(tmp_path / "logs"), RESTART_COUNT_ENV: "1"}
    path = record_worker_error("x.zarr: no chip store\nsecond line", rank=3, environ=env)
    assert path == tmp_path / "logs" / "rank-3.error"
    first = first_worker_error(tmp_path / "logs")
    assert first is not None
    assert (first.rank, first.attempt, first.message) == (3, 1, "x.zarr: no chip store")


def test_the_root_cause_is_the_earliest_error_of_the_last_attempt(tmp_path: Path) -> None:
    write_record(tmp_path, 0, 0, 10.0, "attempt 0: the first failure")
    write_record(tmp_path, 1, 1, 30.0, "RuntimeError: Connection closed by peer")
    write_record(tmp_path, 2, 1, 20.0, "x.zarr: shard 3 is corrupt")
    (tmp_path / "rank-4.error").write_text('{"torn')  # a half-written record is skipped
    first = first_worker_error(tmp_path)
    assert first is not None and first.message == "x.zarr: shard 3 is corrupt"
    clear_worker_errors(tmp_path)
    assert first_worker_error(tmp_path) is None
    assert first_worker_error(tmp_path / "missing") is None


def test_a_refused_input_is_told_from_a_crash(tmp_path: Path) -> None:
    """A rank that refused its input says so, and the launcher can say it as one process does;
    records without the field (older workers, crashes) read as crashes."""
    env = {ERROR_DIR_ENV: str(tmp_path)}
    record_worker_error("no image files match 'x/*.tif'", rank=1, bad_input=True, environ=env)
    first = first_worker_error(tmp_path)
    assert first is not None and first.bad_input and first.rank == 1
    write_record(tmp_path, 1, 0, 1.0, "internal error: KeyError: 'x'")
    again = first_worker_error(tmp_path)
    assert again is not None and not again.bad_input


def test_of_refused_inputs_the_lowest_rank_is_the_one_line(tmp_path: Path) -> None:
    """Ranks that each refuse their own unit: the lowest rank's is the unit one process would
    have met first, so the job says what one process says, whichever rank wrote first.
    Before: the earliest record, so the line changed from run to run."""
    for rank, time_s, rows in [(1, 10.0, "112..224"), (0, 20.0, "0..112"), (2, 5.0, "224..336")]:
        record = {"rank": rank, "attempt": 0, "time_s": time_s, "bad_input": True,
                  "message": f"scene.vrt: reading rows {rows} failed"}  # fmt: skip
        (tmp_path / f"rank-{rank}.error").write_text(json.dumps(record))
    write_record(tmp_path, 3, 0, 1.0, "internal error: RuntimeError: Connection closed by peer")
    first = first_worker_error(tmp_path)
    assert first is not None and first.message == "scene.vrt: reading rows 0..112 failed"
