"""A training run as a cluster job (`cluster.engine.Job`): what every worker is given, and
what the launcher does to the run dir before any worker starts.

Every worker runs `python -m landcover.training STORE --out RUN_DIR [options]`, the argv of its
`TrainConfig` (`TrainConfig.to_argv`), with the store as the job's input `store` and the run dir
as its output `run` (Azure ML mounts both). The configuration each worker gets depends on the
cluster, the same way for every engine (`worker_config`):

- `--resume` when the spec allows restarts: the trainer's `--resume` starts fresh when there is
  no checkpoint and no trained result (`rundir.check_run_dir`), so a restarted worker group
  continues from the last checkpoint, or starts again when it failed before the first. The user's
  `--overwrite` is then done once, by the launcher, before launching (`overwrite_once`), and
  not by the workers (a restarted group must resume, not wipe); a local run dir that already
  holds a run is refused unless `--resume` or `--overwrite` says what to do with it
  (`check_run_dir`).
- `--threads K` unless the user gave it: a fair share of each worker's cores
  (`cluster.engine.threads_per_worker`).

The storage options reach the workers through their environment (`storage_options_env`), never
their command line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from cluster.engine import Job, input_ref, output_ref, threads_per_worker
from cluster.engines import engine_info
from cluster.spec import ClusterSpec
from landcover.options import storage_options_env
from landcover.training import rundir
from landcover.training.config import TrainConfig
from tiling.runtime.urls import is_local

logger = logging.getLogger(__name__)

WORKER_MODULE = "landcover.training"  # `python -m landcover.training`: one training worker
STORE_INPUT = "store"
RUN_OUTPUT = "run"


def worker_config(spec: ClusterSpec, config: TrainConfig) -> TrainConfig:
    """The configuration every worker of `config` gets on `spec` (see the module docstring)."""
    restarts = spec.max_restarts > 0
    threads = config.threads if config.threads is not None else threads_per_worker(spec)
    return replace(
        config,
        resume=config.resume or restarts,
        overwrite=config.overwrite and not restarts,
        threads=threads,
    )


def training_job(
    spec: ClusterSpec,
    config: TrainConfig,
    *,
    entry_module: str = WORKER_MODULE,
    extra_args: Sequence[str] = (),
) -> Job:
    """The job that trains `config` on `spec`. `extra_args` follow the configuration's: a
    stand-in entry module's own arguments, or the worker's -v/-q."""
    worker = replace(
        worker_config(spec, config),
        store_url=input_ref(STORE_INPUT),
        out_dir=output_ref(RUN_OUTPUT),
    )
    return Job(
        entry_module=entry_module,
        argv=(*worker.to_argv(), *extra_args),
        inputs={STORE_INPUT: config.store_url},
        outputs={RUN_OUTPUT: config.out_dir},
        secret_env=storage_options_env(config.storage_options),
    )


def check_run_dir(spec: ClusterSpec, config: TrainConfig) -> None:
    """Refuse a local run dir holding a run that a launch with restarts would continue
    silently (every worker gets --resume) unless the user said --resume or --overwrite.
    Without restarts the workers refuse it themselves."""
    if _restarts_in_local_dir(spec, config):
        rundir.check_run_dir(config.out_dir, resume=config.resume, overwrite=config.overwrite)


def overwrite_once(spec: ClusterSpec, config: TrainConfig) -> None:
    """--overwrite with restarts: remove the old run's results once, before launching (the
    workers themselves only resume)."""
    if not (config.overwrite and _restarts_in_local_dir(spec, config)):
        return
    logger.info("--overwrite: removing the results of %s", config.out_dir)
    rundir.prepare_run_dir(config.out_dir, resume=False, overwrite=True)


def _restarts_in_local_dir(spec: ClusterSpec, config: TrainConfig) -> bool:
    runs_here = engine_info(spec.engine).runs_here
    return runs_here and spec.max_restarts > 0 and is_local(config.out_dir)
