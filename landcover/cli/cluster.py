"""`landcover cluster plan|launch`: thin wrappers over the cluster package (`landcover scale`
is `landcover.cli.scale`).

The training arguments come after `--`, as `landcover train` takes them:
`landcover cluster launch cluster.json -- train chips.zarr --out runs/a --epochs 3`.

They are parsed here by `landcover train`'s own click options (`train_config`; the cluster
package knows nothing of landcover's options), so a bad one is refused before anything is
planned or started, and the job is built from the configuration (`landcover.training.launch`),
the storage options going to the workers' environment. On the local engine the parent also
checks the store and the run dir once (`landcover.training.preflight`) before starting any worker.

`-- tile ARGS` and `-- predict ARGS` are parsed by those commands' own parsers and built into
their stage here (`landcover.cli.tiling.tile_stage`, `landcover.cli.predict.predict_stage`:
options checked once, inputs resolved once), which `landcover.stagerun.run_stage` runs: one
rank per worker of the engine, every rank reading the stage this process publishes; or, on
an engine that runs tasks (dask), here with the units of work (a tile's sources, a tiled
product's tiles) as tasks on the cluster. A one-COG `predict` runs as ranks on every engine.
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
    Plan,
    launch_plan,
    plan_job,
    write_plan_files,
)
from cluster.engines import engine_info
from cluster.spec import ClusterSpec
from cluster.tasks import task_engine
from landcover.cli.stacinputs import pack_stac_inputs
from landcover.cli.stagejob import StageError, logging_args_of
from landcover.errors import TrainingError
from landcover.options import out_dir_option, overwrite_option
from landcover.outputs import check_can_create_in
from landcover.stageconfig import Stage, TileStage
from landcover.stagerun import Ranks, Tasks, rank_job, run_ranks, run_stage
from landcover.training.config import TrainConfig, parse_training
from landcover.training.launch import WORKER_MODULE, check_run_dir, overwrite_once, training_job

PASS_THROUGH = {"ignore_unknown_options": True}

entry_module_option = click.option(
    "--entry-module",
    default=WORKER_MODULE,
    show_default=True,
    hidden=True,
    help="Python module every worker runs with `python -m` (a stand-in for the training "
    "worker: it gets the same arguments, and its own after them).",
)
train_args_argument = click.argument("train_args", nargs=-1, type=click.UNPROCESSED)


def quiet_of(ctx: click.Context) -> bool:
    obj = ctx.find_root().obj
    return bool(obj.get("quiet")) if isinstance(obj, dict) else False


STAGES = ("tile", "predict")


def cluster_stage(ctx: click.Context, stage_args: Sequence[str]) -> Stage | None:
    """For `-- tile ARGS` or `-- predict ARGS`: the stage those arguments ask for, built as
    the command builds it (its own parser, then its stage builder: a bad argument is refused
    before anything is planned); None for training."""
    if not stage_args or stage_args[0] not in STAGES:
        return None
    name, args = stage_args[0], list(stage_args[1:])
    command = ctx.find_root().command
    assert isinstance(command, click.Group)
    stage_command = command.get_command(ctx, name)
    assert stage_command is not None
    with stage_command.make_context(name, args, parent=ctx) as parsed:
        if parsed.get_parameter_source("nproc") is not click.core.ParameterSource.DEFAULT:
            raise StageError(
                f"--nproc is for `landcover {name}` on one machine; on a cluster set "
                "processesPerNode (and targetNodeCount) in cluster.json instead"
            )
        params = dict(parsed.params)
        del params["nproc"]
        if name == "tile":
            from landcover.cli.tiling import tile_stage

            values = pack_stac_inputs(params, search_bbox=True)
            if values.pop("dry_run"):
                raise StageError(
                    "--dry-run writes nothing: run `landcover tile ... --dry-run` here, "
                    "without `cluster launch`"
                )
            images, stac_inputs = values.pop("images"), values.pop("stac_inputs")
            return tile_stage(images=images, stac_inputs=stac_inputs, options=values)
        from landcover.cli.predict import predict_stage

        values = pack_stac_inputs(params, search_bbox=False)
        own = ("images", "stac_inputs", "region", "bbox", "region_crs", "stac_item", "quicklook")
        mine = {key: values.pop(key) for key in own}
        return predict_stage(**mine, options=values)


def _runs_as_tasks(spec: ClusterSpec, stage: Stage) -> bool:
    """Whether `stage` runs here with its units as tasks: on an engine that runs tasks, a
    stage with units (tile, a tiled product); anything else runs as ranks."""
    return engine_info(spec.engine).runs_tasks and stage.runs_units


def describe_stage_tasks(spec: ClusterSpec, stage: Stage) -> str:
    """What running `stage` as tasks on `spec` does, in the words of a plan."""
    unit, after = (
        ("source", "this process appends their staged parts in input order")
        if isinstance(stage, TileStage)
        else ("tile", "this process writes the collection and the mosaic of the tiles")
    )
    return "\n".join(
        [
            f"engine: {spec.engine}",
            *task_engine(spec).describe_tasks(spec, unit=unit, after=after),
            f"stage (this process): {stage.name} into {stage.out}",
            *(f"note: {n}" for n in spec.notes),
        ]
    )


def cluster_training(
    train_args: Sequence[str], spec: ClusterSpec, entry_module: str
) -> tuple[Job, TrainConfig]:
    """The job for the arguments after `--`, and their configuration (`train_config`)."""
    config, stand_in_args = train_config(
        train_args, default_store=spec.data.url, strict=entry_module == WORKER_MODULE
    )
    check_run_dir(spec, config)
    job = training_job(spec, config, entry_module=entry_module, extra_args=stand_in_args)
    return job, config


def train_config(
    train_args: Sequence[str], *, default_store: str | None = None, strict: bool = True
) -> tuple[TrainConfig, tuple[str, ...]]:
    """`[train] STORE --out RUN_DIR [options]` (what follows `--`) parsed by `landcover
    train`'s own click options into its configuration, refused as `landcover train` refuses
    them, before anything is planned. STORE may be left out when cluster.json gives
    `data.url` (`default_store`). `--nproc` is refused: on a cluster the spec decides the
    processes. Not `strict`: the arguments a stand-in entry module takes besides the
    training options, returned second (give STORE then: an unknown option's value could
    otherwise be taken for it)."""
    from landcover.cli.train import train_command

    args = list(train_args)
    if args[:1] == ["train"]:
        del args[0]
    defaults = {"store_url": default_store} if default_store else {}
    no_store = (
        "no chip store: give it after `train` (`-- train STORE --out RUN_DIR ...`) "
        'or set "data": {"url": ...} in cluster.json'
    )
    parsed = parse_training(
        args,
        command=train_command,
        defaults=defaults,
        strict=strict,
        prog="train",
        if_missing={
            "store_url": no_store,
            "out_dir": "the training arguments need --out RUN_DIR (where the run directory goes)",
        },
    )

    def nproc_refused(flag: str) -> Exception:
        return TrainingError(
            f"{flag} is for `landcover train` on one machine; on a cluster set "
            "processesPerNode (and targetNodeCount) in cluster.json instead"
        )

    parsed.refuse_given(["nproc"], nproc_refused)
    return parsed.config, parsed.extra_args


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


@cluster_group.command("plan", context_settings=PASS_THROUGH)
@click.argument("cluster_json", type=click.Path(dir_okay=False, path_type=Path))
@out_dir_option(
    "Also write the plan's files here (torchrun.sh, job.yaml + compute.yaml, "
    "trainjob.yaml / pytorchjob.yaml + secret.yaml, or slurm.sbatch), secrets redacted."
)
@overwrite_option
@entry_module_option
@train_args_argument
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
    ctx = click.get_current_context()
    stage = cluster_stage(ctx, train_args)
    if stage is not None and _runs_as_tasks(spec, stage):
        click.echo(describe_stage_tasks(spec, stage))
        return
    if stage is not None:  # the ranks' job, the stage not published: nothing runs
        job = rank_job(stage, logging_args=logging_args_of(ctx))
    else:
        job = cluster_training(train_args, spec, entry_module)[0]
    plan = plan_job(spec, job)
    click.echo(plan.describe())
    if out_dir is not None:
        written = write_plan_files(plan, out_dir, overwrite=overwrite)
        click.echo("wrote " + ", ".join(str(p) for p in written))


@cluster_group.command("launch", context_settings=PASS_THROUGH)
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
@entry_module_option
@train_args_argument
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
    stage = cluster_stage(ctx, train_args)
    if stage is not None and _runs_as_tasks(spec, stage):
        _run_tasks_and_report(ctx, spec, stage)
        return
    if stage is not None:
        _launch_stage_and_report(ctx, spec, stage, wait=wait, timeout_s=timeout_s)
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


def _run_tasks_and_report(ctx: click.Context, spec: ClusterSpec, stage: Stage) -> None:
    """Show the plan (unless -q), then run the stage here with its units as tasks; print the
    stage's summary, then one line: done, and where."""
    started = time.monotonic()
    if not quiet_of(ctx):
        click.echo(describe_stage_tasks(spec, stage), err=True)
    run_stage(stage, Tasks(spec))
    click.echo(f"done: {spec.engine} tasks in {time.monotonic() - started:.1f} s")


def _launch_stage_and_report(
    ctx: click.Context, spec: ClusterSpec, stage: Stage, *, wait: bool, timeout_s: float | None
) -> None:
    """Run `stage` as the ranks of `spec`'s engine: show the plan (unless -q), launch, and
    print one line: the job submitted, or done and where its output is."""
    quiet = quiet_of(ctx)

    def show(plan: Plan) -> None:
        if not quiet:
            click.echo(plan.describe(), err=True)

    options = LaunchOptions(on_output=None if quiet else click.echo, wait=wait, timeout_s=timeout_s)
    executor = Ranks(
        spec,
        options,
        logging_args=tuple(logging_args_of(ctx)),
        as_one_process=True,  # a rank's refusal of its input: the line one process prints
        on_plan=show,
    )
    launched = run_ranks(stage, executor).launch
    assert launched is not None
    _report_launch(launched, f"output {stage.out}")


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
    quiet = quiet_of(ctx)
    if not quiet:
        click.echo(plan.describe(), err=True)
    options = LaunchOptions(on_output=None if quiet else click.echo, wait=wait, timeout_s=timeout_s)
    before()
    result = launch_plan(plan, options)
    _report_launch(result, result_text(result) if result.status != "submitted" else "")


def _report_launch(result: LaunchResult, result_text: str) -> None:
    """One line: the job submitted, or done with `result_text` (where its results are) and
    its logs."""
    where = f"; {result.url}" if result.url else ""
    if result.status == "submitted":
        click.echo(f"submitted {result.engine} job {result.job_id}{where}")
        if result.log_location and not result.url:
            click.echo(f"logs: {result.log_location}")
    else:
        click.echo(
            f"done: {result.engine} job {result.job_id} in {result.wall_time_s:.1f} s; "
            f"{result_text}"
            + (f"; logs {result.log_location}" if result.log_location else "")
            + where
        )
