"""`landcover cluster plan|launch` and `landcover scale`: thin wrappers over the cluster package.

The training arguments come after `--`, as `landcover train` takes them:
`landcover cluster launch cluster.json -- train chips.zarr --out runs/a --epochs 3`.

They are parsed here by the worker's own options (`TrainConfig.from_argv`; the cluster package
knows nothing of landcover's options), so a bad one is refused before anything is planned or
started, and the job is built from the configuration (`landcover.training.launch`), the storage
options going to the workers' environment. On the local engine the parent also checks the store
and the run dir once (`landcover.training.preflight`) before starting any worker.

`-- tile ARGS` and `-- predict ARGS` run those commands instead, one rank per worker
(`landcover.cli.stagejob`), after their own parser has checked the arguments. On an engine
that runs tasks (dask), `-- tile ARGS` runs here instead, each source a task on the cluster
(`landcover.cli.stagetasks`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from cluster.clusterjson import load_cluster_spec
from cluster.engine import (
    Job,
    LaunchOptions,
    LaunchResult,
    launch_plan,
    plan_job,
    write_plan_files,
)
from cluster.engines import engine_info
from cluster.errors import LaunchError
from cluster.spec import ClusterSpec
from landcover.cli.stagejob import STAGES, StageError, logging_args_of, stage_job
from landcover.cli.stagetasks import describe_stage_tasks, run_stage_as_tasks, runs_as_tasks
from landcover.errors import TrainingError
from landcover.options import cluster_json_option, out_dir_option, overwrite_option
from landcover.outputs import check_can_create_in
from landcover.scaling.sweep import (
    SweepConfig,
    SweepRun,
    format_sweep_table,
    parse_worker_counts,
    run_sweep,
    sweep_training,
)
from landcover.training.config import TrainConfig, split_argv
from landcover.training.launch import WORKER_MODULE, check_run_dir, overwrite_once, training_job

_PASS_THROUGH = {"ignore_unknown_options": True}

_entry_module_option = click.option(
    "--entry-module",
    default=WORKER_MODULE,
    show_default=True,
    hidden=True,
    help="Python module every worker runs with `python -m` (a stand-in for the training "
    "worker: it gets the same arguments, and its own after them).",
)
_train_args_argument = click.argument("train_args", nargs=-1, type=click.UNPROCESSED)


def _quiet(ctx: click.Context) -> bool:
    obj = ctx.find_root().obj
    return bool(obj.get("quiet")) if isinstance(obj, dict) else False


def train_argv(args: Sequence[str], *, default_store: str | None = None) -> list[str]:
    """`train STORE --out RUN_DIR [options]` (what follows `--` on the command line) as the
    worker's argv. The leading word `train` is optional; STORE may be left out when
    cluster.json gives `data.url`. `--nproc` is refused: on a cluster the spec decides the
    processes. --out is checked here, to say what it is for."""
    tokens = list(args)
    if tokens and tokens[0] == "train":
        tokens.pop(0)
    if not tokens or tokens[0].startswith("-"):
        if not default_store:
            raise TrainingError(
                "no chip store: give it after `train` (`-- train STORE --out RUN_DIR ...`) "
                'or set "data": {"url": ...} in cluster.json'
            )
        tokens.insert(0, default_store)
    outs = [i for i, t in enumerate(tokens) if t == "--out" or t.startswith("--out=")]
    if len(outs) > 1:
        raise TrainingError("--out is given twice in the training arguments; keep one")
    if not outs or tokens[outs[0]] == "--out=":
        raise TrainingError(
            "the training arguments need --out RUN_DIR (where the run directory goes)"
        )
    if tokens[outs[0]] == "--out" and outs[0] + 1 >= len(tokens):
        raise TrainingError("--out needs a value: `--out RUN_DIR`")
    if any(t == "--nproc" or t.startswith("--nproc=") for t in tokens):
        raise TrainingError(
            "--nproc is for `landcover train` on one machine; on a cluster set "
            "processesPerNode (and targetNodeCount) in cluster.json instead"
        )
    return tokens


def cluster_stage(ctx: click.Context, stage_args: Sequence[str]) -> tuple[Job, str] | None:
    """For `-- tile ARGS` or `-- predict ARGS`: the job whose every worker runs that command as
    one rank, and the output it writes; None for training. The arguments are checked by the
    command's own parser first, so a bad one is refused before anything is planned."""
    if not stage_args or stage_args[0] not in STAGES:
        return None
    stage, args = stage_args[0], list(stage_args[1:])
    if any(t == "--nproc" or t.startswith("--nproc=") for t in args):
        raise StageError(
            f"--nproc is for `landcover {stage}` on one machine; on a cluster set "
            "processesPerNode (and targetNodeCount) in cluster.json instead"
        )
    command = ctx.find_root().command
    assert isinstance(command, click.Group)
    stage_command = command.get_command(ctx, stage)
    assert stage_command is not None
    with stage_command.make_context(stage, list(args), parent=ctx) as parsed:
        params = dict(parsed.params)
    if stage == "predict":
        from landcover.cli.predict import check_distinct_outputs

        check_distinct_outputs(params)
    job = stage_job(
        stage,
        args,
        storage_options=params.get("storage_options") or {},
        logging_args=logging_args_of(ctx),
    )
    return job, str(params["out"])


def cluster_training(
    train_args: Sequence[str], spec: ClusterSpec, entry_module: str
) -> tuple[Job, TrainConfig]:
    """The job for the arguments after `--`, and their configuration, refused as a worker
    would refuse them (a stand-in entry module also gets the arguments it alone takes)."""
    argv = train_argv(train_args, default_store=spec.data.url)
    config, stand_in_args = split_argv(argv, strict=entry_module == WORKER_MODULE)
    check_run_dir(spec, config)
    job = training_job(spec, config, entry_module=entry_module, extra_args=stand_in_args)
    return job, config


@click.group("cluster")
def cluster_group() -> None:
    """Plan or launch training, tiling or prediction on the cluster described by cluster.json.

    \b
    landcover cluster plan cluster.json [--out DIR] -- train STORE --out RUN [options]
    landcover cluster launch cluster.json -- train STORE --out RUN [options]
    landcover cluster launch cluster.json -- tile 'naip/*.tif' --labels ... --out STORE
    landcover cluster launch cluster.json -- predict model.pt 'naip/*.tif' --out lc.tif

    Tile and predict run as one rank per worker, sharing the sources or the output's rows.
    """


@cluster_group.command("plan", context_settings=_PASS_THROUGH)
@click.argument("cluster_json", type=click.Path(dir_okay=False, path_type=Path))
@out_dir_option(
    "Also write the plan's files here (torchrun.sh, job.yaml + compute.yaml, "
    "trainjob.yaml / pytorchjob.yaml + secret.yaml, or slurm.sbatch), secrets redacted."
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
    if out_dir is not None:
        check_can_create_in(out_dir, option="--out")
    spec = load_cluster_spec(cluster_json)
    staged = cluster_stage(click.get_current_context(), train_args)
    if staged is not None and engine_info(spec.engine).runs_tasks and runs_as_tasks(train_args):
        click.echo(describe_stage_tasks(spec, train_args))
        return
    job = staged[0] if staged else cluster_training(train_args, spec, entry_module)[0]
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
    help="azureml/kubernetes/slurm: wait for the job to end (Azure ML: and download the run "
    "dir; slurm: follow its state and rank 0's log, scancel on Ctrl-C). "
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
    """Run the training (or tile, or predict) on the engine of cluster.json (local: stream
    the workers' output)."""
    spec = load_cluster_spec(cluster_json)
    staged = cluster_stage(ctx, train_args)
    if staged is not None and engine_info(spec.engine).runs_tasks and runs_as_tasks(train_args):
        _run_tasks_and_report(ctx, spec, train_args)
        return
    if staged is not None:
        job, out = staged
        _launch_and_report(
            ctx, spec, job, wait=wait, timeout_s=timeout_s, result_text=lambda _: f"output {out}"
        )
        return
    job, config = cluster_training(train_args, spec, entry_module)
    if entry_module == WORKER_MODULE and engine_info(spec.engine).runs_here:
        from landcover.training.preflight import check_local_training  # imports torch

        check_local_training(config, world_sizes=(spec.workers,))
    _launch_and_report(
        ctx,
        spec,
        job,
        wait=wait,
        timeout_s=timeout_s,
        before=lambda: overwrite_once(spec, config),
        result_text=lambda r: f"run dir {r.run_dir or config.out_dir}",
    )


def _run_tasks_and_report(ctx: click.Context, spec: ClusterSpec, stage_args: Sequence[str]) -> None:
    """Show the plan (unless -q), then run the stage here with its units as tasks; the
    stage prints its own summary, then one line: done, and where."""
    started = time.monotonic()
    if not _quiet(ctx):
        click.echo(describe_stage_tasks(spec, stage_args), err=True)
    run_stage_as_tasks(ctx, spec, stage_args)
    click.echo(f"done: {spec.engine} tasks in {time.monotonic() - started:.1f} s")


def _launch_and_report(
    ctx: click.Context,
    spec: ClusterSpec,
    job: Job,
    *,
    wait: bool,
    timeout_s: float | None,
    result_text: Callable[[LaunchResult], str],
    before: Callable[[], None] = lambda: None,
) -> None:
    """Show the plan (unless -q), run `before`, launch, and print one line: the job
    submitted, or done with `result_text(result)` (where its results are) and its logs."""
    plan = plan_job(spec, job)
    quiet = _quiet(ctx)
    if not quiet:
        click.echo(plan.describe(), err=True)
    options = LaunchOptions(on_output=None if quiet else click.echo, wait=wait, timeout_s=timeout_s)
    before()
    result = launch_plan(plan, options)
    where = f"; {result.url}" if result.url else ""
    if result.status == "submitted":
        click.echo(f"submitted {result.engine} job {result.job_id}{where}")
        if result.log_location and not result.url:
            click.echo(f"logs: {result.log_location}")
    else:
        click.echo(
            f"done: {result.engine} job {result.job_id} in {result.wall_time_s:.1f} s; "
            f"{result_text(result)}"
            + (f"; logs {result.log_location}" if result.log_location else "")
            + where
        )


@click.command("scale", context_settings=_PASS_THROUGH)
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


def _check_sweep(config: SweepConfig) -> None:
    """Refuse bad training arguments before any run (parsed as the workers parse them), and
    on the local engine check the store once for every worker count."""
    from landcover.training.preflight import check_local_training  # imports torch

    training, _ = sweep_training(config)
    if config.cluster is None or engine_info(config.cluster.engine).runs_here:
        # the sweep replaces its own run dirs: only the store is checked
        check_local_training(training, world_sizes=config.workers, check_out_dir=False)
