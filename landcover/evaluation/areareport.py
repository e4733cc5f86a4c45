"""The report of a sample-based evaluation (`landcover evaluate --reference`): metrics.json,
metrics.md and report.html in one directory, all or none. Every text in the page that comes
from the user's files (paths, class names) is HTML-escaped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from landcover.evaluation.areaestimate import Z_95, AreaEstimate
from landcover.evaluation.report import check_report_directory, check_report_target
from landcover.evaluation.samplecompare import SampleEvaluation
from landcover.markup import html_text, markdown_text
from landcover.outputs import (
    finish_directory_output,
    write_files_atomic,
)
from tiling.runtime.atomic import text_writer

__all__ = [
    "AREA_REPORT_FILES",
    "area_markdown",
    "area_report_html",
    "check_area_report_target",
    "write_area_report",
]

AREA_REPORT_FILES = ("metrics.json", "metrics.md", "report.html")


def check_area_report_target(out_dir: str | os.PathLike[str], *, overwrite: bool) -> list[Path]:
    """The report's paths in `out_dir`; refused before any work when `out_dir` is a file, or
    holds one of them without `overwrite`, or takes no new files."""
    return check_report_target(out_dir, overwrite=overwrite, names=AREA_REPORT_FILES)


def write_area_report(
    evaluation: SampleEvaluation, out_dir: str | os.PathLike[str], *, overwrite: bool = False
) -> list[Path]:
    """metrics.json, metrics.md and report.html of `evaluation` in `out_dir`."""
    paths = check_area_report_target(out_dir, overwrite=overwrite)
    old = check_report_directory(out_dir, overwrite=overwrite)
    texts = (
        json.dumps(evaluation.to_json(), indent=2) + "\n",
        area_markdown(evaluation),
        area_report_html(evaluation),
    )
    new = [p.name for p in paths]
    write_files_atomic(
        [(p, text_writer(t)) for p, t in zip(paths, texts, strict=True)], overwrite=overwrite
    )
    finish_directory_output(out_dir, old, new)
    return paths


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _area_rows(e: AreaEstimate) -> list[list[str]]:
    total = e.total_area
    rows = []
    for c in e.classes:
        low, high = c.area_ci
        rows.append(
            [
                str(c.code),
                c.name,
                f"{c.mapped_area:,.4f}",
                f"{c.area:,.4f}",
                f"{c.area_se:,.4f}",
                f"{low:,.4f} – {high:,.4f}",
                _pct(c.area / total if total else None),
                _pct(Z_95 * c.proportion_se),
                str(c.sample_size),
            ]
        )
    return rows


AREA_HEADER = [
    "code",
    "class",
    "mapped km²",
    "estimated km²",
    "SE km²",
    "95 % CI km²",
    "estimated %",
    "± % (95 %)",
    "points",
]
ACCURACY_HEADER = ["code", "class", "user's", "SE", "producer's", "SE"]


def _accuracy_rows(e: AreaEstimate) -> list[list[str]]:
    return [
        [
            str(c.code),
            c.name,
            _num(c.users_accuracy),
            _num(c.users_accuracy_se),
            _num(c.producers_accuracy),
            _num(c.producers_accuracy_se),
        ]
        for c in e.classes
    ]


def _matrix_rows(e: AreaEstimate) -> tuple[list[str], list[list[str]]]:
    names = [c.name for c in e.classes]
    header = ["map \\ reference", *names, "total"]
    rows = []
    for i, name in enumerate(names):
        row = e.proportions[i]
        rows.append([name, *(f"{v:.4f}" for v in row), f"{row.sum():.4f}"])
    rows.append(["total", *(f"{c.proportion:.4f}" for c in e.classes), "1.0000"])
    return header, rows


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(markdown_text(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(markdown_text(v) for v in row) + " |" for row in rows),
    ]


def area_markdown(evaluation: SampleEvaluation) -> str:
    """The estimates as Markdown: areas, accuracies and the error matrix of area
    proportions."""
    e = evaluation.estimate
    source = evaluation.reference_raster or evaluation.reference
    lines = [
        f"# Area and accuracy of {markdown_text(Path(evaluation.prediction).name)}",
        "",
        f"Stratified sample: {int(e.counts.sum()):,} points of "
        f"{markdown_text(Path(evaluation.reference).name)}, references from "
        f"{markdown_text(Path(source).name)} "
        "(estimators of Olofsson et al. 2014; 95 % CI = estimate ± 1.96 SE).  ",
        f"Map: {e.total_area:,.4f} km² in {e.total_pixels:,} pixels.  ",
        f"Overall accuracy: {_num(e.overall_accuracy)} (SE {_num(e.overall_accuracy_se)})",
        "",
    ]
    if evaluation.points_without_reference:
        lines += [
            f"{evaluation.points_without_reference} points on the truth raster's nodata were "
            "left out.",
            "",
        ]
    lines += ["## Area", "", *_md_table(AREA_HEADER, _area_rows(e)), ""]
    lines += ["## Accuracy", "", *_md_table(ACCURACY_HEADER, _accuracy_rows(e)), ""]
    header, rows = _matrix_rows(e)
    lines += ["## Error matrix of estimated area proportions", "", *_md_table(header, rows)]
    return "\n".join(lines) + "\n"


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html_text(v)}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
    "td:nth-child(2),th:nth-child(2){text-align:left}"
)


def area_report_html(evaluation: SampleEvaluation) -> str:
    """The estimates as one self-contained HTML page."""
    e = evaluation.estimate
    title = f"Area and accuracy of {Path(evaluation.prediction).name}"
    source = evaluation.reference_raster or evaluation.reference
    header, rows = _matrix_rows(e)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html_text(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html_text(title)}</h1>",
        f"<p>Stratified sample of {int(e.counts.sum()):,} points "
        f"({html_text(Path(evaluation.reference).name)}), references from "
        f"{html_text(Path(source).name)}; estimators of Olofsson et al. (2014), "
        "95 % CI = estimate ± 1.96 SE.</p>",
        f"<p>Overall accuracy {_num(e.overall_accuracy)} (SE {_num(e.overall_accuracy_se)}); "
        f"map area {e.total_area:,.4f} km².</p>",
        "<h2>Area</h2>",
        _html_table(AREA_HEADER, _area_rows(e)),
        "<h2>Accuracy</h2>",
        _html_table(ACCURACY_HEADER, _accuracy_rows(e)),
        "<h2>Error matrix of estimated area proportions</h2>",
        _html_table(header, rows),
        "</body></html>\n",
    ]
    return "\n".join(parts)
