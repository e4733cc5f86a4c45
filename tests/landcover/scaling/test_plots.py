"""Figures of the scaling report: PNGs of the size asked for, with curves drawn, for finished,
oversubscribed and incomplete runs; importing the figures never imports the report."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from landcover.scaling.curves import ScalingReport, build_scaling_report
from landcover.scaling.plots import projection_png, scaling_png
from landcover.scaling.runs import load_runs
from tests.landcover.scaling.runfiles import CPU, power_law_runs, write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def every_kind_of_run(root: Path) -> ScalingReport:
    planned = {"config": {"epochs": 3}}
    power_law_runs(root, [1, 2, 4], run_json=planned)
    # oversubscribed (hollow marker) and incomplete (a cross, off the lines)
    write_run(root, "w8", workers=8, epoch_times=[90.0, 80.0], run_json={"cores": 2, **planned})
    write_run(root, "w16", workers=16, epoch_times=[30.0, 1.0], run_json={"config": {"epochs": 30}})
    return build_scaling_report(load_runs([root]), project_to=(64, 148))


def test_scaling_figure_has_four_panels_of_curves(tmp_path: Path) -> None:
    report = every_kind_of_run(tmp_path)
    data = scaling_png(report.curves_of(CPU), CPU)
    assert png_size(data) == (12 * 90, 9 * 90)  # 12 x 9 inches at 90 dpi
    assert len(data) > 20_000  # axes, curves and labels, not an empty canvas


def test_projection_figure_reaches_the_projected_worker_counts(tmp_path: Path) -> None:
    report = every_kind_of_run(tmp_path)
    (curve,) = report.curves_of(CPU)
    assert curve.projection is not None
    # 1003 chips in batches of 8: 64 workers get 15 chips each, 148 get 6, less than a batch,
    # so 148 is refused with its reason, never drawn
    assert {p.workers for p in curve.projection.points} >= {64}
    assert 148 not in {p.workers for p in curve.projection.points}
    assert curve.projection.refused is not None and "148" in curve.projection.refused
    data = projection_png(report.curves_of(CPU), CPU, report.project_to)
    assert png_size(data) == (10 * 90, 7 * 90)
    assert len(data) > 20_000


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("landcover.scaling.plots", "landcover.scaling.report"),  # no plots <-> report circle
        ("landcover.scaling.report", "matplotlib"),  # the report loads the figures lazily
    ],
)
def test_imports_stay_one_way(module: str, absent: str) -> None:
    code = f"import sys, {module}; print({absent!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
