"""Scaling curves: the run records a report reads, the sweep over worker counts, the projection
beyond the measured points, the plots and the report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.scaling.curves import ScalingReport, build_scaling_report
    from landcover.scaling.projection import fit_power_law, parse_network, project
    from landcover.scaling.report import ReportPaths, write_scaling_report
    from landcover.scaling.runs import RunSummary, load_runs
    from landcover.scaling.sweep import SweepConfig, SweepResult, run_sweep

__all__ = [
    "ReportPaths",
    "RunSummary",
    "ScalingReport",
    "SweepConfig",
    "SweepResult",
    "build_scaling_report",
    "fit_power_law",
    "load_runs",
    "parse_network",
    "project",
    "run_sweep",
    "write_scaling_report",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "RunSummary": "runs",
        "load_runs": "runs",
        "SweepConfig": "sweep",
        "SweepResult": "sweep",
        "run_sweep": "sweep",
        "ScalingReport": "curves",
        "build_scaling_report": "curves",
        "fit_power_law": "projection",
        "parse_network": "projection",
        "project": "projection",
        "ReportPaths": "report",
        "write_scaling_report": "report",
    },
)
