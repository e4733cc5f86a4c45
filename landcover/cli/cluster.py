"""`landcover cluster plan|launch` and `landcover scale`: thin wrappers over the cluster package.

The training arguments come after `--`, as `landcover train` takes them:
`landcover cluster launch cluster.json -- train chips.zarr --out runs/a --epochs 3`.

They are parsed here by the training command's own parser (the cluster package knows nothing
of landcover's options), so a bad one is refused before anything is planned or started, and the
storage options leave the worker arguments for the workers' environment (`TrainJob.secret_env`).
On the local engine the parent also checks the store and the run dir once
(`landcover.training.preflight`) before starting any worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cluster.engine import (
    DEFAULT_ENTRY_MODULE,
    LaunchOptions,
    TrainJob,
    launch_plan,
    parse_train_args,
    plan_job,
    write_plan_files,
)
from cluster.errors import LaunchError
from cluster.spec import ClusterSpec, load_cluster_spec
from landcover.cli.options import overwrite_option
from landcover.scaling.sweep import (
    RUN_PREFIX,
    SweepConfig,
    SweepRun,
    check_extra_args,
    format_sweep_table,
    parse_worker_counts,
    run_sweep,
)

if TYPE_CHECKING:
    from landcover.training import TrainConfig

_PASS_THROUGH = {"ignore_unknown_options": True}

_entry_module_option = click.option(
    "--entry-module",
    default=DEFAULT_ENTRY_MODULE,
    show_default=True,
    hidden=True,
    help="Python module every worker runs with `python -m`.",
)
_train_args_argument = click.argument("train_args", nargs=-1, type=click.UNPROCESSED)


def _quiet(ctx: click.Context) -> bool:
    obj = ctx.find_root().obj
    return bool(obj.get("quiet")) if isinstance(obj, dict) else False


def training_job(
    train_args: Sequence[str], spec: ClusterSpec, entry_module: str
) -> tuple[TrainJob, TrainConfig | None]:
    """The job for the arguments after `--`, validated by the training command's parser and
    TrainConfig; (job, None) for another entry module, which parses its own arguments."""
    from landcover.cli.train import config_from_params, job_from_context, parse_training_args

    job = parse_train_args(train_args, default_store=spec.data.url, entry_module=entry_module)
    if entry_module != DEFAULT_ENTRY_MODULE:
        return job, None
    ctx = parse_training_args([job.store, "--out", job.out, *job.args])
    config = config_from_params(ctx.params)
    return job_from_context(ctx, entry_module=entry_module), config


@click.group("cluster")
def cluster_group() -> None:
    """Plan or launch training on the cluster described by cluster.json.

    \b
    landcover cluster plan cluster.json [--out DIR] -- train STORE --out RUN [options]
    landcover cluster launch cluster.json -- train STORE --out RUN [options]
    """


@cluster_group.command("plan", context_settings=_PASS_THROUGH)
@click.argument("cluster_json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write the plan's files here (torchrun.sh, job.yaml + compute.yaml, or "
    "pytorchjob.yaml), secrets redacted.",
)
@overwrite_option
@_entry_module_option
@_train_args_argument
def plan_command(
    cluster_json: Path,
    out_dir: Path | None,
    overwrite: bool,
    entry_module: str,
    train_args: tuple[str, ...],
) -> None:
    """Print exactly what `launch` would do (secrets redacted)."""
    spec = load_cluster_spec(cluster_json)
    job, _ = training_job(train_args, spec, entry_module)
    plan = plan_job(spec, job)
    click.echo(plan.describe())
    if out_dir is not None:
        written = write_plan_files(plan, out_dir, overwrite=overwrite)
        click.echo("wrote " + ", ".join(str(p) for p in written))


@cluster_group.command("launch", context_settings=_PASS_THROUGH)
@click.argument("cluster_json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--wait/--no-wait",
    default=False,
    help="azureml/kubernetes: wait for the job to end (Azure ML: and download the run dir). "
    "The local engine always waits.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Stop a local job (or stop waiting) after this many seconds.",
)
@_entry_module_option
@_train_args_argument
@click.pass_context
def launch_command(
    ctx: click.Context,
    cluster_json: Path,
    wait: bool,
    timeout_s: float | None,
    entry_module: str,
    train_args: tuple[str, ...],
) -> None:
    """Run the training on the engine of cluster.json (local: stream the workers' output)."""
    spec = load_cluster_spec(cluster_json)
    job, config = training_job(train_args, spec, entry_module)
    if config is not None and spec.engine == "local":
        from landcover.training.preflight import check_local_training

        check_local_training(config, world_sizes=(spec.workers,))
    plan = plan_job(spec, job)
    quiet = _quiet(ctx)
    if not quiet:
        click.echo(plan.describe(), err=True)
    options = LaunchOptions(on_output=None if quiet else click.echo, wait=wait, timeout_s=timeout_s)
    result = launch_plan(plan, options)
    where = f"; {result.url}" if result.url else ""
    if result.status == "submitted":
        click.echo(f"submitted {result.engine} job {result.job_id}{where}")
        if result.log_location and not result.url:
            click.echo(f"logs: {result.log_location}")
    else:
        click.echo(
            f"done: {result.engine} job {result.job_id} in {result.wall_time_s:.1f} s; "
            f"run dir {result.run_dir or job.out}; logs {result.log_location}{where}"
        )


@click.command("scale", context_settings=_PASS_THROUGH)
@click.argument("store")
@click.option("--workers", "workers_text", required=True, help="Worker counts, e.g. 1,2,4.")
@click.option("--epochs", type=click.IntRange(min=1), required=True, help="Epochs per run.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Sweep directory: one run dir per worker count (workers-N) and sweep.json.",
)
@click.option(
    "--cluster",
    "cluster_json",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="cluster.json to run on (default: this machine, one node, N processes).",
)
@click.option(
    "--overwrite", is_flag=True, help="Redo every run (default: reuse the finished ones)."
)
@_entry_module_option
@_train_args_argument
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
    if entry_module == DEFAULT_ENTRY_MODULE:
        config = _checked_sweep(config)
    quiet = _quiet(ctx)

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


def _checked_sweep(config: SweepConfig) -> SweepConfig:
    """The sweep with its training arguments validated by the training command's parser, the
    storage options moved to the workers' environment, and, on the local engine, the store
    checked once for every worker count."""
    from landcover.cli.train import config_from_params, job_from_context, parse_training_args
    from landcover.training.preflight import check_local_training

    check_extra_args(config.extra_args)  # --out and --epochs are the sweep's
    run_dir = str(Path(config.out_dir) / f"{RUN_PREFIX}{config.workers[0]}")
    ctx = parse_training_args([config.store, "--out", run_dir, *config.extra_args])
    train_config = config_from_params(ctx.params)
    if config.cluster is None or config.cluster.engine == "local":
        # the sweep replaces its own run dirs: only the store is checked
        check_local_training(train_config, world_sizes=config.workers, check_out_dir=False)
    job = job_from_context(ctx, entry_module=config.entry_module)
    return replace(config, extra_args=job.args, secret_env=job.secret_env)
