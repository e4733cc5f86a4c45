"""`landcover scale`: the same training at several worker counts, on this machine or the
engine of a cluster.json (`landcover.scaling.sweep`); the training arguments after `--` are
parsed as `landcover cluster launch -- train` parses them (`landcover.cli.cluster`).
"""

from __future__ import annotations

from pathlib import Path

import click

from cluster.clusterjson import load_cluster_spec
from cluster.engine import LaunchOptions
from cluster.engines import engine_info
from cluster.errors import LaunchError
from landcover.cli.cluster import PASS_THROUGH, entry_module_option, quiet_of, train_args_argument
from landcover.options import cluster_json_option, out_dir_option
from landcover.outputs import check_can_create_in
from landcover.scaling.sweep import (
    SweepConfig,
    SweepRun,
    format_sweep_table,
    parse_worker_counts,
    run_sweep,
    sweep_training,
)
from landcover.training.launch import WORKER_MODULE


@click.command("scale", context_settings=PASS_THROUGH)
@click.argument("store")
@click.option("--workers", "workers_text", required=True, help="Worker counts, e.g. 1,2,4.")
@click.option("--epochs", type=click.IntRange(min=1), required=True, help="Epochs per run.")
@out_dir_option(
    "Sweep directory: one run dir per worker count (workers-N) and sweep.json.", required=True
)
@cluster_json_option("cluster.json to run on (default: this machine, one node, N processes).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Redo every run, removing the runs the previous sweep.json recorded (default: reuse "
    "the finished runs that had the same threads per worker).",
)
@entry_module_option
@train_args_argument
@click.pass_context
def scale_command(
    ctx: click.Context,
    store: str,
    workers_text: str,
    epochs: int,
    out_dir: Path,
    cluster_json: Path | None,
    overwrite: bool,
    entry_module: str,
    train_args: tuple[str, ...],
) -> None:
    """Train the same model at several worker counts and print epoch time against workers.

    \b
    landcover scale chips.zarr --workers 1,2,4 --epochs 3 --out sweep -- --model small_unet

    Extra training options go after `--`. Each run goes to OUT/workers-N; OUT/sweep.json
    lists them. More workers than cores runs, but is marked oversubscribed. A rerun reuses
    the runs that finished.
    """
    check_can_create_in(out_dir, option="--out")
    config = SweepConfig(
        store=store,
        workers=parse_worker_counts(workers_text),
        epochs=epochs,
        out_dir=str(out_dir),
        extra_args=tuple(train_args),
        cluster=load_cluster_spec(cluster_json) if cluster_json is not None else None,
        entry_module=entry_module,
        overwrite=overwrite,
    )
    if entry_module == WORKER_MODULE:
        _check_sweep(config)
    quiet = quiet_of(ctx)

    def worker_output(line: str) -> None:
        click.echo(line, err=True)

    def run_done(run: SweepRun) -> None:
        if not quiet:
            state = run.status + (f": {run.error}" if run.error else "")
            click.echo(f"workers {run.workers}: {state}", err=True)

    options = LaunchOptions(on_output=None if quiet else worker_output)
    result = run_sweep(config, options, on_run=run_done)
    click.echo(format_sweep_table(result))
    click.echo(f"sweep: {result.path}")
    if result.failed:
        first = result.failed[0]
        raise LaunchError(
            f"{len(result.failed)} of {len(result.runs)} runs failed; "
            f"workers {first.workers}: {first.error}"
        )


def _check_sweep(config: SweepConfig) -> None:
    """Refuse bad training arguments before any run (parsed as the workers parse them), and
    on the local engine check the store once for every worker count."""
    from landcover.training.preflight import check_local_training  # imports torch

    training, _ = sweep_training(config)
    if config.cluster is None or engine_info(config.cluster.engine).runs_here:
        # the sweep replaces its own run dirs: only the store is checked
        check_local_training(training, world_sizes=config.workers, check_out_dir=False)
