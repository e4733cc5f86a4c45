"""One training worker, built then run: `train(config)`.

`python -m landcover.training STORE --out RUN_DIR [options]` is the worker entry point for every
launcher (torchrun, Azure ML, Kubeflow); `landcover train` runs it in-process or spawns N local
workers through torchrun. `train` builds, in this order, then hands everything to the `Trainer`
(as pytorch/examples' ddp-tutorial-series/multinode.py does):

1. rank 0 checks the run dir (refuses old results unless `--overwrite`, or `--resume` with a
   checkpoint to resume), and every rank learns whether there is a checkpoint to resume; a run
   that fails before it writes anything there removes the run dir it made;
2. the store (its checks, and the steps per epoch of this world) and the model, seeded: a bad
   `--model`/`--pretrained` fails before the long load;
3. the resume state (`landcover.training.resume`: a checkpoint of another store or sync mode is
   refused; the run continues at the next epoch, exactly);
4. every rank checks that its shard fits in RAM, then loads its train and val shards ONCE
   (timed: `load_time_s`, never part of `epoch_time_s`);
5. the sync strategy (`landcover.training.sync`: DDP with a comm hook, or BMUF), the optimizer
   and its schedule (`landcover.training.schedule`: peak = base lr x a function of the world
   size, warm-up, cosine to 1 % of the peak), derived for the world this run has;
6. rank 0 writes run.json and opens the trackers (`landcover.training.tracking`: TensorBoard,
   MLflow; last, so that nothing can fail between their start and `Trainer.fit`, which
   finishes them); then `Trainer.fit`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from landcover.errors import OutputBusyError, TrainingError
from landcover.outputlock import exclusive_outputs
from landcover.training.builders import (
    build_model,
    build_optimization,
    load_training_data,
    open_store_for_training,
)
from landcover.training.config import TrainConfig
from landcover.training.distributed import (
    Collectives,
    DistEnv,
    check_sync_bn,
    configure_threads,
    process_group,
    read_dist_env,
    training_device,
)
from landcover.training.outputs import write_run_info
from landcover.training.placement import Placement
from landcover.training.resume import resume_state
from landcover.training.rundir import prepare_run_dir, removed_if_left_empty
from landcover.training.sync import build_sync
from landcover.training.tracking import Tracking, open_tracking
from landcover.training.trainer import TrainCallbacks, Trainer, TrainResult

__all__ = ["train"]


def train(
    config: TrainConfig,
    *,
    dist_env: DistEnv | None = None,
    callbacks: TrainCallbacks | None = None,
) -> TrainResult:
    """Run one training worker (the whole job when the world is one process)."""
    env = read_dist_env() if dist_env is None else dist_env
    # Rank 0 makes the run dir: a run that fails before writing into it leaves none behind.
    cleanup = (
        removed_if_left_empty(config.out_dir)
        if env.is_main and "://" not in config.out_dir
        else nullcontext()
    )
    with cleanup:
        threads = configure_threads(config.threads, env.local_world_size)
        device = training_device(config.device, env)
        check_sync_bn(config.sync_bn, env, device)
        with process_group(env, device) as collectives, _run_dir_lock(config, collectives):
            place = Placement.create(env, collectives, device, threads=threads, amp=config.amp)
            return build_trainer(config, place, callbacks or TrainCallbacks()).fit()


@contextmanager
def _run_dir_lock(config: TrainConfig, collectives: Collectives) -> Iterator[None]:
    """Rank 0 holds the run dir's lock for the whole run (`landcover.outputlock`): a second
    `train` into the same --out (a --resume or an --overwrite too) is refused at once, on every
    rank, instead of writing over this run's checkpoints. A run dir where no lock file can be
    made is left to the run dir's own check."""
    with ExitStack() as stack:
        error: str | None = None
        if collectives.env.is_main:
            try:
                stack.enter_context(exclusive_outputs([str(config.out_dir)], "train"))
            except OutputBusyError as exc:
                error = str(exc)
            except OSError:
                pass
        collectives.raise_if_any(error)
        yield


def build_trainer(config: TrainConfig, place: Placement, callbacks: TrainCallbacks) -> Trainer:
    """Steps 1-6 of the module docstring: every object the loop needs, then the Trainer."""
    env, collectives, device = place.env, place.collectives, place.device
    checkpoint = _prepare_run_dir(config, collectives)
    store, identity = open_store_for_training(config, env)
    steps = store.steps_per_epoch(world_size=env.world_size, batch_size=config.batch_size)
    module = build_model(config, store, device, channels_last=place.channels_last)
    resume = resume_state(checkpoint, config, collectives, module, store=identity)
    data = load_training_data(
        config, env, collectives, device, store=store, identity=identity, steps=steps
    )
    sync, module = build_sync(
        module, config, collectives, device, own=resume.own, shared=resume.bmuf
    )
    optimization = build_optimization(
        config, module, world_size=env.world_size, steps_per_epoch=steps, resume=resume
    )
    ranks = collectives.gather_to_main(place.where())
    if ranks is not None:  # rank 0
        write_run_info(config, place, data, optimization, resume, ranks)
    tracking = _open_tracking(config, collectives, [c.name for c in store.class_map.classes])
    return Trainer(config, place, sync, optimization, data, resume, callbacks, tracking)


def _open_tracking(
    config: TrainConfig, collectives: Collectives, class_names: list[str]
) -> Tracking:
    """Rank 0's trackers; a tracker asked for and not installed fails every rank."""
    error: str | None = None
    tracking = Tracking()
    try:
        tracking = open_tracking(config, is_main=collectives.env.is_main, class_names=class_names)
    except TrainingError as exc:
        error = str(exc)
    collectives.raise_if_any(error)
    return tracking


def _prepare_run_dir(config: TrainConfig, collectives: Collectives) -> Path | None:
    """Rank 0 checks and resets the run dir; every rank learns whether to resume."""
    error: str | None = None
    checkpoint: Path | None = None
    if collectives.env.is_main:
        try:
            checkpoint = prepare_run_dir(
                config.out_dir, resume=config.resume, overwrite=config.overwrite
            )
        except (TrainingError, OSError) as exc:
            error = str(exc)
    collectives.raise_if_any(error)
    return collectives.broadcast_object(checkpoint)
