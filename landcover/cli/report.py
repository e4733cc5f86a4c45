"""`landcover report ...`: reports from training runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from landcover.options import out_dir_option, overwrite_option
from landcover.outputs import check_can_create_in
from landcover.scaling.projection import DEFAULT_NETWORK, parse_network
from landcover.scaling.report import (
    DEFAULT_PROJECT_TO,
    build_scaling_report,
    report_markdown,
    write_report_files,
)
from landcover.scaling.runs import load_runs


class WorkerCounts(click.ParamType):  # type: ignore[type-arg]
    """A comma-separated list of worker counts, e.g. `8,16,64,148`."""

    name = "counts"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        counts: list[int] = []
        for part in str(value).split(","):
            if not part.strip():
                continue
            try:
                count = int(part)
            except ValueError:
                self.fail(f"{part.strip()!r} is not an integer; give e.g. 8,16,64,148", param, ctx)
            if count < 1:
                self.fail(f"{count} workers: worker counts must be >= 1", param, ctx)
            counts.append(count)
        return tuple(counts)


@click.group("report")
def report_group() -> None:
    """Reports from training runs (scaling curves)."""


@report_group.command("scaling")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@out_dir_option("Directory for report.md, report.html and the PNG plots.", required=True)
@click.option(
    "--project-to",
    type=WorkerCounts(),
    default=",".join(str(n) for n in DEFAULT_PROJECT_TO),
    show_default=True,
    help="Worker counts to project the epoch time to (comma-separated).",
)
@click.option(
    "--network",
    default=None,
    help="Interconnect for the projection: a network name (e.g. infiniband-edr-100g), a VM "
    "size (e.g. Standard_NC24rs_v3) or '<Gbit/s>gbit[:<latency_us>us]' (e.g. 25gbit:30us). "
    "Default: the network of the runs' cluster.vmSize in run.json, else "
    f"{DEFAULT_NETWORK.name}.",
)
@overwrite_option
def scaling_command(
    run_dirs: tuple[Path, ...],
    out_dir: Path,
    project_to: tuple[int, ...],
    network: str | None,
    overwrite: bool,
) -> None:
    """Epoch time vs workers, speed-up, efficiency and a projection to large clusters.

    RUN_DIRS are `landcover train --out` directories or sweep directories holding them.
    """
    check_can_create_in(out_dir, option="--out")
    chosen = parse_network(network) if network is not None else None
    runs = load_runs(run_dirs)
    report = build_scaling_report(runs, project_to=project_to, network=chosen)
    paths = write_report_files(report, out_dir, overwrite=overwrite)
    click.echo(report_markdown(report))
    click.echo(f"report: {paths.html}")
    click.echo(f"markdown: {paths.markdown}")
    for image in paths.images:
        click.echo(f"plot: {image}")
