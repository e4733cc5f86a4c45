"""`landcover train` and the worker command behind `python -m landcover.training`.

Both commands take the same options, generated from `TrainConfig`'s fields
(`landcover.training.config.train_options`); `landcover train` adds `--nproc N`, which runs N
local workers on the cluster package's local engine (torchrun, the same launch as `landcover
cluster launch` on one node), or the one worker in this process when N is 1. Before any worker
starts, the parent checks what it can (`landcover.training.preflight`); a worker that fails
leaves its one-line error for the parent (`cluster.failures`), which reports the first one. The
workers get the configuration's argv (`landcover.training.launch.training_job`), except the
storage options, which reach them through their environment: an account key never appears on a
worker's command line or in a log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
from collections.abc import Mapping
from typing import Any

import click

from cluster.engine import LaunchOptions, launch_job
from cluster.failures import record_worker_error
from cluster.redact import Redactor, collect_secret_values
from cluster.spec import local_spec
from landcover.cli.app import USER_ERRORS, UserFacingError, log_warnings, terminate_on_sigterm
from landcover.errors import TrainingError
from landcover.options import check_output_url
from landcover.outputlock import exclusive_outputs
from landcover.outputs import local_output
from landcover.training.config import config_from_params, nproc_option, train_options
from landcover.training.launch import training_job


@click.command("train")
@train_options
@nproc_option
@click.pass_context
def train_command(ctx: click.Context, /, nproc: int, **params: Any) -> None:
    """Train a segmentation model on chip store STORE, writing RUN_DIR (--out)."""
    from landcover.training import train
    from landcover.training.preflight import check_local_training
    from landcover.training.rundir import removed_if_left_empty
    from tiling.runtime.urls import check_storage_options

    config = config_from_params(params)
    # a file:// RUN_DIR is its path, for this process and the workers' argv alike
    config = dataclasses.replace(config, out_dir=local_output(config.out_dir))
    if nproc < 1:
        raise TrainingError(f"--nproc {nproc} must be >= 1")
    # This process or its local workers write RUN_DIR: a local directory. (A launcher may
    # give a job other places, e.g. an Azure ML output: `landcover cluster launch`.)
    check_output_url(config.out_dir, option="--out")
    check_storage_options([config.store_url, config.out_dir], config.storage_options)
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
    spec = local_spec(nproc)
    # the worker's own logging options, as `landcover -v/-q` was given
    logging_args = ["-v"] * verbose + (["-q"] if quiet else [])
    job = training_job(spec, config, extra_args=logging_args)
    # The lock probe makes RUN_DIR's parent, the workers RUN_DIR: a launch that fails before
    # anything is written there leaves neither behind.
    with removed_if_left_empty(config.out_dir):
        with contextlib.suppress(OSError), exclusive_outputs([config.out_dir], "train"):
            pass  # a run writing RUN_DIR now: refused before the workers start (rank 0 takes it)
        launch_job(spec, job, LaunchOptions(on_output=None if quiet else _to_stderr))
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
    except USER_ERRORS as exc:  # this rank refused its input: the job's cause, whenever it ends
        _leave_error(str(exc), rank, params, bad_input=True)
        raise UserFacingError(str(exc), exit_code=2) from exc
    except Exception as exc:  # a bug: the traceback stays in this worker's log
        _leave_error(f"internal error: {type(exc).__name__}: {exc}", rank, params)
        raise


def _leave_error(
    message: str, rank: int | None, params: Mapping[str, Any], *, bad_input: bool = False
) -> None:
    """This worker's one-line error, for the launcher that asked for it (cluster.failures);
    storage secrets scrubbed, since an fsspec error may quote them. `bad_input`: one of our
    errors about the input (a damaged shard), which the launcher reports before the other
    ranks' lost connections, however the ranks' clocks order them."""
    secrets = collect_secret_values(params.get("storage_options") or {})
    record_worker_error(Redactor(secrets).text(message), rank=rank, bad_input=bad_input)
