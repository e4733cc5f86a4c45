"""The evaluation report: metrics.json, metrics.md and confusion.png in one directory, and
the confusion-matrix plot; with the scenes' panels (`landcover.evaluation.panels`), also
classes.png, panel-NN.png per scene and report.html.

Each file is replaced atomically once all are rendered; matplotlib is imported only when a
plot is drawn. Names (of the maps, the truth files and the classes) are text in every file:
escaped for Markdown and HTML, and never mathtext in a plot (`landcover.markup`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from landcover.errors import EvaluationError
from landcover.evaluation.scores import Evaluation
from landcover.markup import markdown_text
from landcover.outputs import (
    check_can_create_in,
    check_directory_output,
    finish_directory_output,
    output_directory,
    refuse_existing,
    write_bytes_atomic,
    write_files_atomic,
)

if TYPE_CHECKING:
    from landcover.evaluation.panels import ScenePanel

__all__ = [
    "REPORT_FILES",
    "check_report_target",
    "confusion_png",
    "plot_confusion",
    "write_report",
]

REPORT_FILES = ("metrics.json", "metrics.md", "confusion.png")
PICTURE_FILES = ("classes.png", "report.html")  # and panel-NN.png, with the panels
PANEL_GLOB = "panel-[0-9]*.png"


def panel_name(number: int) -> str:
    """The file name of the panel of scene `number` (from 1)."""
    return f"panel-{number:02d}.png"


def is_report_file(name: str) -> bool:
    """Whether `name` is a file of an evaluation report (either mode's): what --overwrite
    removes from a report directory."""
    return name in {*REPORT_FILES, *PICTURE_FILES, "report.html"} or Path(name).match(PANEL_GLOB)


def check_report_directory(out_dir: str | os.PathLike[str], *, overwrite: bool) -> set[str]:
    """`outputs.check_directory_output` for an evaluation report: `out_dir` holds one report
    (of either mode), refused when it holds anything else without `overwrite`; returns the
    names of the old report's files."""
    return check_directory_output(
        out_dir, overwrite=overwrite, what="evaluation report", owned=is_report_file
    )


def check_report_target(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool,
    pictures: bool = False,
    names: Sequence[str] = REPORT_FILES,
) -> list[Path]:
    """The paths of the report files `names` in `out_dir`, refused when `out_dir` is not a
    directory, holds anything (another report, a user's file) without `overwrite`
    (`check_report_directory`), or takes no new files. `pictures` (the panels are asked
    for) changes nothing since any content is refused. Cheap: call it before evaluating."""
    target = output_directory(
        out_dir, fix=f"give a directory for {', '.join(names)}", error=EvaluationError
    )
    paths = [target / name for name in names]
    refuse_existing(paths, overwrite=overwrite)  # a report there: the plain message
    check_report_directory(target, overwrite=overwrite)
    check_can_create_in(target, option="--out")
    return paths


def write_report(
    evaluation: Evaluation,
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    panels: Sequence[ScenePanel] | None = None,
) -> list[Path]:
    """metrics.json, metrics.md and confusion.png in `out_dir` (with `panels`, also
    classes.png, a panel-NN.png per scene and report.html), all or none, put in place once
    all are rendered and written (a failing plot or a full disk replaces nothing; without
    `overwrite`, a file that appeared since the check is never replaced)."""
    paths = check_report_target(out_dir, overwrite=overwrite, pictures=panels is not None)
    old = check_report_directory(out_dir, overwrite=overwrite)
    png = confusion_png(evaluation)
    pictures = [] if panels is None else _pictures(evaluation, png, panels)
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvaluationError(f"--out {out_dir}: cannot create it ({exc.strerror})") from None
    texts = (json.dumps(evaluation.to_json(), indent=2) + "\n", _markdown_report(evaluation))
    new = [*(p.name for p in paths), *(name for name, _ in pictures)]
    write_files_atomic(
        [
            (paths[0], lambda tmp: Path(tmp).write_text(texts[0], encoding="utf-8")),
            (paths[1], lambda tmp: Path(tmp).write_text(texts[1], encoding="utf-8")),
            (paths[2], lambda tmp: Path(tmp).write_bytes(png)),
            *((Path(out_dir) / name, _bytes_writer(data)) for name, data in pictures),
        ],
        overwrite=overwrite,
    )
    finish_directory_output(out_dir, old, new)
    return [*paths, *(Path(out_dir) / name for name, _ in pictures)]


def _pictures(
    evaluation: Evaluation, confusion: bytes, panels: Sequence[ScenePanel]
) -> list[tuple[str, bytes]]:
    """(file name, bytes) of the panels, classes.png and report.html."""
    from landcover.evaluation.panels import classes_png, panel_png, report_html

    drawn = [(panel_name(i), panel_png(p, evaluation.class_map)) for i, p in enumerate(panels, 1)]
    classes = classes_png(evaluation)
    page = report_html(
        evaluation,
        confusion=confusion,
        classes=classes,
        panels=[(p.name, png) for p, (_, png) in zip(panels, drawn, strict=True)],
    )
    return [*drawn, ("classes.png", classes), ("report.html", page.encode("utf-8"))]


def _bytes_writer(data: bytes) -> Callable[[str], object]:
    return lambda tmp: Path(tmp).write_bytes(data)


def plot_confusion(evaluation: Evaluation, path: str | os.PathLike[str]) -> None:
    """Write `confusion_png(evaluation)` to `path` atomically."""
    write_bytes_atomic(path, confusion_png(evaluation))


def confusion_png(evaluation: Evaluation) -> bytes:
    """Row-normalised confusion matrix (each truth class sums to 1) with counts, as PNG."""
    import matplotlib

    from landcover.heatmap import matrix_png

    matplotlib.use("Agg")
    confusion = evaluation.confusion.astype(np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    share = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    return matrix_png(
        share,
        [[f"{int(v):,}" for v in row] for row in evaluation.confusion],
        [c.name for c in evaluation.classes],
        axes=("predicted", "truth"),
        colour=("Blues", "share of truth class"),
        title=f"accuracy {evaluation.pixel_accuracy:.3f}, mIoU {evaluation.mean_iou:.3f}",
        margin_in=(2.0, 1.6),
    )


def _markdown_report(evaluation: Evaluation) -> str:
    truth = ", ".join(Path(t).name for t in evaluation.truth)
    header = [
        f"# Evaluation of {markdown_text(Path(evaluation.prediction).name)}",
        "",
        f"Truth: {markdown_text(truth)} "
        f"(remapped with {markdown_text(evaluation.truth_class_map)})  ",
        "",
    ]
    return "\n".join(header) + evaluation.to_markdown()
