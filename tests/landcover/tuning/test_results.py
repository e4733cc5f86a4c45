"""The table and figure of a search."""

from __future__ import annotations

from pathlib import Path

from landcover.tuning.results import TrialRow, best_row, format_trials_table, write_results

ROWS = (
    TrialRow(0, {"lr": 0.00123456, "loss": "ce"}, 0.41, 2, "complete", "trial-000"),
    TrialRow(1, {"lr": 0.01, "loss": "ce+dice"}, 0.52, 1, "pruned", "trial-001"),
    TrialRow(2, {"lr": 0.002, "loss": "ce"}, 0.47, 2, "complete", "trial-002"),
    TrialRow(3, {}, None, 0, "fail", "trial-003"),
)


def test_best_is_the_best_complete_trial_not_a_pruned_one() -> None:
    assert best_row(ROWS) == ROWS[2]
    assert best_row(ROWS[1:2]) is None


def test_table_has_a_row_per_trial() -> None:
    lines = format_trials_table(ROWS).splitlines()
    assert lines[0] == "| trial | params | best val mIoU | epochs | state | run dir |"
    assert lines[2] == "| 0 | lr=0.001235, loss=ce | 0.4100 | 2 | complete | trial-000 |"
    assert lines[5] == "| 3 |  | - | 0 | fail | trial-003 |"
    assert len(lines) == 2 + len(ROWS)


def test_results_files(tmp_path: Path) -> None:
    table, plot = write_results(tmp_path, ROWS)
    text = table.read_text()
    assert text.startswith(format_trials_table(ROWS))
    assert text.endswith("best: trial 2 (trial-002)\n")
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.md", "trials.png"]
