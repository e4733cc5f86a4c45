"""The results of a search: one row per trial, a Markdown table (OUT/trials.md, also printed)
and a figure (OUT/trials.png: the best val mIoU of every trial and the best so far).

Optuna-free: `landcover.tuning.study` turns the study's trials into `TrialRow`s, whose scores
come from each trial's own metrics.jsonl. matplotlib is imported only to draw the figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landcover.markup import markdown_text, plain_figures
from landcover.outputs import write_atomic, write_text_atomic

__all__ = [
    "PLOT_FILE",
    "TABLE_FILE",
    "TrialRow",
    "best_row",
    "format_trials_table",
    "write_results",
]

TABLE_FILE = "trials.md"
PLOT_FILE = "trials.png"


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One trial: its number, parameters, best val mIoU over its epochs (None before its first
    epoch), epochs finished, state (complete, pruned, fail, running, waiting) and run dir."""

    number: int
    params: Mapping[str, Any] = field(hash=False)
    best_val_miou: float | None
    epochs: int
    state: str
    run_dir: str

    @property
    def params_text(self) -> str:
        return ", ".join(f"{name}={_value_text(v)}" for name, v in self.params.items())


def best_row(rows: Sequence[TrialRow]) -> TrialRow | None:
    """The complete trial with the highest val mIoU (a pruned one stopped early: its score is
    not that of a full run); None before any trial completed."""
    complete = [r for r in rows if r.state == "complete" and r.best_val_miou is not None]
    return max(complete, key=lambda r: (r.best_val_miou, -r.number), default=None)


def format_trials_table(rows: Sequence[TrialRow]) -> str:
    """A Markdown table: trial, params, best val mIoU, epochs, state, run dir."""
    header = ("trial", "params", "best val mIoU", "epochs", "state", "run dir")
    lines = [_row(header), _row(tuple("---" for _ in header))]
    for r in rows:
        miou = "-" if r.best_val_miou is None else f"{r.best_val_miou:.4f}"
        lines.append(_row((str(r.number), r.params_text, miou, str(r.epochs), r.state, r.run_dir)))
    return "\n".join(lines)


def write_results(out_dir: Path, rows: Sequence[TrialRow]) -> tuple[Path, Path]:
    """OUT/trials.md and OUT/trials.png, each written atomically."""
    table_path, plot_path = out_dir / TABLE_FILE, out_dir / PLOT_FILE
    best = best_row(rows)
    best_line = f"best: trial {best.number} ({best.run_dir})" if best else "best: none yet"
    write_text_atomic(table_path, f"{format_trials_table(rows)}\n\n{best_line}\n")
    with plain_figures():  # a matplotlibrc's text.usetex would need LaTeX
        write_atomic(plot_path, lambda tmp: _plot(rows, Path(tmp)))
    return table_path, plot_path


def _plot(rows: Sequence[TrialRow], path: Path) -> None:
    """Each trial's best val mIoU (filled: complete, hollow: pruned) and the running best of
    the complete trials, against the trial number. The object API on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for state, face in (("complete", "C0"), ("pruned", "none")):
        shown = [
            (r.number, r.best_val_miou)
            for r in rows
            if r.state == state and r.best_val_miou is not None
        ]
        if not shown:
            continue
        ax.scatter(
            [number for number, _ in shown],
            [miou for _, miou in shown],
            facecolors=face,
            edgecolors="C0",
            label=state,
            zorder=3,
        )
    best_x: list[int] = []
    best_y: list[float] = []
    running = -math.inf
    for r in sorted(rows, key=lambda r: r.number):
        if r.state == "complete" and r.best_val_miou is not None:
            running = max(running, r.best_val_miou)
        if math.isfinite(running):
            best_x.append(r.number)
            best_y.append(running)
    ax.step(best_x, best_y, where="post", color="C1", label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("best val mIoU")
    ax.set_title("landcover tune")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.savefig(path, format="png", dpi=100)


def _row(cells: tuple[str, ...]) -> str:
    """A table row; parameter values and paths are text, never Markdown (`landcover.markup`)."""
    return "| " + " | ".join(c if set(c) <= {"-"} else markdown_text(c) for c in cells) + " |"


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
