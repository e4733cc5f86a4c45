"""`landcover train` and the worker command behind `python -m landcover.training`.

Both commands take the same options, defined once in `train_options`; `landcover train` adds
`--nproc N`, which runs N local workers on the cluster package's local engine (torchrun, the
same launch as `landcover cluster launch` on one node), or the one worker in this process when
N is 1. Before any worker starts, the parent checks what it can (`landcover.training.preflight`); a
worker that fails leaves its one-line error for the parent (`cluster.failures`), which reports
the first one. The workers get the options given on the command line, except the storage
options, which reach them through their environment (`storage_options_env`): an account key
never appears on a worker's command line or in a log.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from cluster.engine import DEFAULT_ENTRY_MODULE, TrainJob
from landcover.cli.options import (
    overwrite_option,
    storage_options_env,
    storage_options_option,
)

if TYPE_CHECKING:
    from landcover.training import TrainConfig

F = TypeVar("F", bound=Callable[..., Any])

WORKER_PROG = "python -m landcover.training"
# Parameters a TrainJob carries itself (store, run dir) or passes as environment (secrets).
_JOB_PARAMS = ("store", "out_dir", "storage_options")
_LOGGING_PARAMS = ("verbose", "quiet")


def train_options(f: F) -> F:
    """STORE, --out and every training option (shared by `landcover train` and the worker)."""
    decorators = [
        click.argument("store"),
        click.option("--out", "out_dir", required=True, help="Run directory (RUN_DIR)."),
        click.option("--model", default="small_unet", show_default=True,
                     help="Model registry name (landcover.models.registry.available())."),
        click.option("--pretrained", type=click.Choice(["imagenet"]), default=None,
                     help="Start the encoder from ImageNet weights (needs the torch hub cache)."),
        click.option("--epochs", type=int, default=10, show_default=True),
        click.option("--batch-size", type=int, default=16, show_default=True,
                     help="Chips per step per worker."),
        click.option("--lr", type=float, default=None,
                     help="Base learning rate (default 2e-3 adamw, 0.02 sgd), scaled by the "
                     "world size per --lr-scaling, linear warm-up then cosine decay."),
        click.option("--lr-scaling", type=click.Choice(["linear", "sqrt", "none"]),
                     default="linear", show_default=True,
                     help="How the base lr grows with the number of workers (not with BMUF)."),
        click.option("--warmup-epochs", type=float, default=1.0, show_default=True),
        click.option("--weight-decay", type=float, default=1e-4, show_default=True),
        click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw",
                     show_default=True),
        click.option("--loss", type=click.Choice(["ce", "ce+dice"]), default="ce",
                     show_default=True, help="Cross-entropy ignoring nodata, optionally + Dice."),
        click.option("--class-weights", type=click.Choice(["auto", "none"]), default="auto",
                     show_default=True,
                     help="auto: median-frequency weights from the store's class counts."),
        click.option("--augment/--no-augment", default=True, show_default=True,
                     help="Random flips and 90-degree rotations."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--patience", type=int, default=None,
                     help="Stop after this many epochs without a better val mIoU."),
        click.option("--resume", is_flag=True,
                     help="Continue from RUN_DIR/checkpoints/last.pt (fresh start if none)."),
        overwrite_option,
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                     show_default=True),
        click.option("--amp/--no-amp", default=None,
                     help="bf16 autocast (default: on for CUDA, off on CPU)."),
        click.option("--threads", type=int, default=None,
                     help="Torch threads per worker (default: cores / local workers)."),
        storage_options_option,
        click.option("--compression", default="none", show_default=True,
                     help="DDP gradient compression: none, fp16, bf16, powersgd[:RANK], onebit."),
        click.option("--block-momentum", is_flag=True,
                     help="BMUF: local steps, then a block-level model average with momentum."),
        click.option("--block-size", type=int, default=8, show_default=True,
                     help="BMUF: local steps per block."),
        click.option("--block-momentum-value", type=float, default=None,
                     help="BMUF block momentum (default 1 - 1/workers)."),
        click.option("--block-lr", type=float, default=1.0, show_default=True,
                     help="BMUF block learning rate."),
        click.option("--nesterov/--no-nesterov", default=True, show_default=True,
                     help="BMUF: Nesterov-style block momentum."),
        click.option("--reset-local-momentum/--keep-local-momentum", default=True,
                     show_default=True,
                     help="BMUF: zero each worker's optimizer momentum after every block end."),
        click.option("--allow-incomplete", is_flag=True,
                     help="Train on a store whose tiling was interrupted (default: refuse it)."),
        click.option("--sync-bn", is_flag=True,
                     help="SyncBatchNorm: normalise with the whole step's batch statistics "
                     "(CUDA only; without it, BatchNorm statistics are averaged over the "
                     "workers after every epoch)."),
    ]  # fmt: skip
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def config_from_params(params: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig for parsed options (imports torch, so only when a run starts)."""
    from landcover.training import TrainConfig

    values = {k: v for k, v in params.items() if k not in _LOGGING_PARAMS}
    return TrainConfig(store_url=values.pop("store"), **values)


def parse_training_args(args: Sequence[str]) -> click.Context:
    """`STORE --out RUN_DIR [options]` parsed by the worker's own parser, so that a launcher
    refuses what every worker would refuse; a bad argument is one TrainingError line."""
    from landcover.errors import TrainingError

    try:
        return worker_command.make_context(WORKER_PROG, list(args))
    except click.UsageError as exc:
        raise TrainingError(f"training arguments: {exc.format_message()}") from None


def job_from_context(
    ctx: click.Context, *, entry_module: str = DEFAULT_ENTRY_MODULE, extra: Sequence[str] = ()
) -> TrainJob:
    """The job that runs these parsed training arguments on every worker: the options given on
    the command line as arguments, the storage options as secret environment."""
    given = {
        name: value
        for name, value in ctx.params.items()
        if name not in _JOB_PARAMS and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }
    return TrainJob(
        store=str(ctx.params["store"]),
        out=str(ctx.params["out_dir"]),
        args=(*params_to_argv(worker_command, given), *extra),
        entry_module=entry_module,
        secret_env=storage_options_env(ctx.params.get("storage_options") or {}),
    )


@click.command("train")
@train_options
@click.option("--nproc", type=int, default=1, show_default=True,
              help="Local worker processes (torchrun); 1 trains in this process.")  # fmt: skip
@click.pass_context
def train_command(ctx: click.Context, /, nproc: int, **params: Any) -> None:
    """Train a segmentation model on chip store STORE, writing RUN_DIR (--out)."""
    from cluster.engine import LaunchOptions, launch_job
    from cluster.spec import local_spec
    from landcover.errors import TrainingError
    from landcover.training import train
    from landcover.training.preflight import check_local_training

    config = config_from_params(params)
    if nproc < 1:
        raise TrainingError(f"--nproc {nproc} must be >= 1")
    if nproc == 1:
        result = train(config)
        if math.isnan(result.best_val_miou):  # a store without val chips
            scores = "no validation (the store has no val chips); model.pt is the last epoch"
        else:
            scores = f"best val mIoU {result.best_val_miou:.4f} at epoch {result.best_epoch}"
        click.echo(f"{result.run_dir}: {result.epochs_completed} epochs, {scores}")
        return
    # Fail here, with one clean line, rather than in N workers.
    check_local_training(config, world_sizes=(nproc,))
    root = ctx.find_root().obj or {}
    verbose, quiet = int(root.get("verbose", 0)), bool(root.get("quiet", False))
    job = job_from_context(ctx, extra=["-v"] * verbose + (["-q"] if quiet else []))
    launch_job(local_spec(nproc), job, LaunchOptions(on_output=None if quiet else _to_stderr))
    click.echo(f"{config.out_dir}: trained with {nproc} workers")


def _to_stderr(line: str) -> None:
    click.echo(line, err=True)


@click.command("worker", context_settings={"help_option_names": ["-h", "--help"]})
@train_options
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def worker_command(verbose: int, quiet: bool, **params: Any) -> None:
    """One training worker: `python -m landcover.training STORE --out RUN_DIR [options]`.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, ... from the launcher (torchrun, Azure ML, Kubeflow).
    """
    from landcover.cli.app import USER_ERRORS, UserFacingError, log_warnings, terminate_on_sigterm
    from landcover.training import train
    from landcover.training.distributed import read_dist_env

    rank: int | None = None
    log_warnings(verbose=verbose > 0)  # as `landcover` does: one log line per warning
    try:
        env = read_dist_env()
        rank = env.rank
        # Rank 0 speaks for the job; the others only report problems.
        level = logging.INFO if env.is_main else logging.WARNING
        if quiet:
            level = logging.WARNING
        elif verbose > 1:
            level = logging.DEBUG
        logging.basicConfig(
            level=level,
            format=f"%(asctime)s rank {env.rank} %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        with terminate_on_sigterm():  # a launcher's stop: checkpoints and temp files close
            train(config_from_params(params), dist_env=env)
    except USER_ERRORS as exc:
        _leave_error(str(exc), rank, params)
        raise UserFacingError(str(exc), exit_code=2) from exc
    except Exception as exc:  # a bug: the traceback stays in this worker's log
        _leave_error(f"internal error: {type(exc).__name__}: {exc}", rank, params)
        raise


def _leave_error(message: str, rank: int | None, params: Mapping[str, Any]) -> None:
    """This worker's one-line error, for the launcher that asked for it (cluster.failures);
    storage secrets scrubbed, since an fsspec error may quote them."""
    from cluster.failures import record_worker_error
    from cluster.redact import Redactor, collect_secret_values

    secrets = collect_secret_values(params.get("storage_options") or {})
    record_worker_error(Redactor(secrets).text(message), rank=rank)


def params_to_argv(command: click.Command, params: Mapping[str, Any]) -> list[str]:
    """Command-line arguments that make `command` parse to `params` again."""
    argv: list[str] = []
    for param in command.params:
        if param.name not in params:
            continue
        value = params[param.name]
        if isinstance(param, click.Argument):
            argv.append(str(value))
            continue
        if not isinstance(param, click.Option) or value is None:
            continue
        if param.count:
            argv += [param.opts[0]] * int(value)
        elif param.is_flag and param.secondary_opts:
            argv.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                argv.append(param.opts[0])
        else:
            text = json.dumps(value) if isinstance(value, Mapping) else str(value)
            argv += [_long_opt(param), text]
    return argv


def _long_opt(param: click.Option) -> str:
    return max(param.opts, key=len)
