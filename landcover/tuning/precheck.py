"""Every value of a search checked as `landcover train` checks it, before the first trial.

A trial may draw any value of the space, so each bound of a range and each choice, set on the
trials' configuration, is checked once before the study starts; a value that would fail is
one line naming the `--space` item, the value and the fix, and no trial (or study.db) is
written. `SearchSpace.check` builds the TrainConfig of each value (and each pair of values);
here the values meet train's own checks that need the machine, the store or torch:

- every model name is registered (wherever the trials run);
- where the trials run here (in this process, or on the local engine): the device exists
  (`training_device`, and `--sync-bn` on it for several workers), the store passes train's
  preflight with the value (`check_local_training`: it opens, has labels, and every worker
  gets a batch of the value's `batch_size`), and the model builds with the store's bands and
  classes (`build_model`: a `pretrained` value needs its cached weights).

The trials' store must also hold val chips, which rank the trials.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from cluster.engines import engine_info
from cluster.spec import ClusterSpec
from landcover.errors import LandcoverError, TrainingError, TuneError
from landcover.training.config import TrainConfig
from landcover.tuning.space import SearchSpace, parameter_values
from tiling.errors import TilingError
from tiling.runtime.rankenv import DistEnv

__all__ = ["check_trial_values"]


def check_trial_values(
    space: SearchSpace, training: TrainConfig, *, cluster: ClusterSpec | None
) -> None:
    """Refuse a value of `space` that a trial of `training` would fail on (module docstring);
    `cluster`: where the trials run (None: in this process)."""
    from landcover.models.registry import check_model_name  # imports torch

    runs_here = cluster is None or engine_info(cluster.engine).runs_here
    workers = 1 if cluster is None else cluster.workers
    env = DistEnv(world_size=workers, local_world_size=workers)
    built: set[tuple[str, str | None]] = set()
    for label, config in _candidates(space, training):
        try:
            check_model_name(config.model)
            if runs_here:
                _check_runs_here(config, env, built)
        except (LandcoverError, TilingError) as exc:
            if not label:  # the trials' own configuration: train's error as it is
                raise
            raise TuneError(f"{label}: {exc}") from None


def _candidates(space: SearchSpace, training: TrainConfig) -> Iterator[tuple[str, TrainConfig]]:
    """The trials' configuration itself (label ""), then each value of each parameter set on it
    (labelled with its `--space` item); `SearchSpace.check` has made them all valid."""
    yield "", training
    for parameter in space:
        for value in parameter_values(parameter):
            yield f"--space {parameter}", replace(training, **{parameter.name: value})


def _check_runs_here(config: TrainConfig, env: DistEnv, built: set[tuple[str, str | None]]) -> None:
    """Train's checks of one configuration on this machine; `built`: the (model, pretrained)
    pairs already built (building one takes seconds)."""
    import torch

    from landcover.training.builders import build_model
    from landcover.training.distributed import check_sync_bn, training_device
    from landcover.training.preflight import check_local_training

    device = training_device(config.device, env)
    if env.is_distributed:  # with one worker it only warns that there is nothing to sync
        check_sync_bn(config.sync_bn, env, device)
    store = check_local_training(config, world_sizes=(env.world_size,), check_out_dir=False)
    if len(store.val_ids) == 0:
        raise TrainingError(
            f"{config.store_url} has no val chips, and the trials are ranked by val mIoU; "
            "tile it with --val-fraction > 0"
        )
    key = (config.model, config.pretrained)
    if key not in built:
        build_model(config, store, torch.device("cpu"), channels_last=False)
        built.add(key)
