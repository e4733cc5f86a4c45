"""`landcover train` and the worker command behind `python -m landcover.train`.

Both commands take the same options, defined once in `train_options`; `landcover train` adds
`--nproc N`, which runs N local workers through torchrun (`python -m torch.distributed.run
--standalone --nproc-per-node N -m landcover.train <the same options>`), or the one worker
in this process when N is 1.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from landcover.commands.options import overwrite_option, storage_options_option

F = TypeVar("F", bound=Callable[..., Any])

WORKER_PROG = "python -m landcover.train"


def train_options(f: F) -> F:
    """STORE, --out and every training option (shared by `landcover train` and the worker)."""
    decorators = [
        click.argument("store"),
        click.option("--out", "out_dir", required=True, help="Run directory (RUN_DIR)."),
        click.option("--model", default="small_unet", show_default=True,
                     help="Model registry name (landcover.models.available())."),
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
        click.option("--sync-bn", is_flag=True,
                     help="SyncBatchNorm: normalise with the whole step's batch statistics "
                     "(CUDA only; without it, BatchNorm statistics are averaged over the "
                     "workers after every epoch)."),
    ]  # fmt: skip
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def config_from_params(params: Mapping[str, Any]) -> Any:
    """The TrainConfig for parsed options (imports torch, so only when a run starts)."""
    from landcover.train import TrainConfig

    values = dict(params)
    return TrainConfig(store_url=values.pop("store"), **values)


@click.command("train")
@train_options
@click.option("--nproc", type=int, default=1, show_default=True,
              help="Local worker processes (torchrun); 1 trains in this process.")  # fmt: skip
@click.pass_context
def train_command(ctx: click.Context, /, nproc: int, **params: Any) -> None:
    """Train a segmentation model on chip store STORE, writing RUN_DIR (--out)."""
    from landcover.distributed import usable_cores
    from landcover.errors import TrainingError
    from landcover.rundir import check_run_dir
    from landcover.train import train

    config = config_from_params(params)
    if nproc < 1:
        raise TrainingError(f"--nproc {nproc} must be >= 1")
    if nproc == 1:
        result = train(config)
        click.echo(
            f"{result.run_dir}: {result.epochs_completed} epochs, best val mIoU "
            f"{result.best_val_miou:.4f} at epoch {result.best_epoch}"
        )
        return
    # Fail here, with one clean line, rather than in N workers.
    check_run_dir(config.out_dir, resume=config.resume, overwrite=config.overwrite)
    verbose = (ctx.obj or {}).get("verbose", 0)
    quiet = (ctx.obj or {}).get("quiet", False)
    argv = params_to_argv(worker_command, params)
    argv += ["-v"] * verbose + (["-q"] if quiet else [])
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "landcover.train", *argv,
    ]  # fmt: skip
    threads = config.threads or max(1, usable_cores() // nproc)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    logging.getLogger(__name__).info("running %s", " ".join(command))
    returncode = subprocess.run(command, env=env, check=False).returncode
    if returncode != 0:
        raise TrainingError(
            f"training workers failed (torchrun exit code {returncode}); "
            "the workers' errors are above"
        )
    click.echo(f"{config.out_dir}: trained with {nproc} workers")


@click.command("worker", context_settings={"help_option_names": ["-h", "--help"]})
@train_options
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def worker_command(verbose: int, quiet: bool, **params: Any) -> None:
    """One training worker: `python -m landcover.train STORE --out RUN_DIR [options]`.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, ... from the launcher (torchrun, Azure ML, Kubeflow).
    """
    from landcover.cli import USER_ERRORS, UserFacingError
    from landcover.distributed import read_dist_env
    from landcover.train import train

    try:
        env = read_dist_env()
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
        train(config_from_params(params), dist_env=env)
    except USER_ERRORS as exc:
        raise UserFacingError(str(exc), exit_code=2) from exc


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
