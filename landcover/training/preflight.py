"""What can be known about a training run before any worker starts, checked once.

`open_training_store` holds the store checks (it opens, it is complete, it has labels, and it
has val chips when `--patience` needs them) and `TrainingStore.steps_per_epoch` the one that
needs the world size (every worker gets at least one batch). Every worker calls them when it
opens the store, since a launcher on another machine (Azure ML, Kubernetes) has no parent
that could. `check_local_training` runs the same checks, and the run dir's (with `--resume`,
its checkpoint's: `landcover.training.resume`), in the parent of local workers (`landcover
train --nproc N`, `landcover scale`, `landcover cluster launch` on the local engine): a store
that will not do is then one line before any worker starts, not N workers that each import
torch, load, and fail with the same message. So is a `--model` name that names no model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from landcover.data.shards import steps_per_epoch
from landcover.errors import TrainingError
from landcover.training.rundir import check_run_dir
from tiling.chipstore.store import StoreSummary, assign_chips_to_ranks, open_store
from tiling.sources.classes import ClassMap

if TYPE_CHECKING:
    from landcover.training.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainingStore:
    """A chip store that passed the checks: its summary, classes and the chips of each split."""

    url: str
    summary: StoreSummary
    class_map: ClassMap
    train_ids: npt.NDArray[np.int64]
    val_ids: npt.NDArray[np.int64]

    def steps_per_epoch(self, *, world_size: int, batch_size: int) -> int:
        """Steps every worker takes per epoch; TrainingError when a worker gets no batch."""
        lengths = [len(ids) for ids in assign_chips_to_ranks(self.train_ids, world_size)]
        steps = steps_per_epoch(lengths, batch_size)
        if steps < 1:
            raise TrainingError(
                f"{len(self.train_ids)} train chips over {world_size} workers give "
                f"{min(lengths)} chips per worker, fewer than --batch-size {batch_size}; use a "
                "smaller batch or fewer workers"
            )
        return steps


def open_training_store(
    url: str,
    *,
    storage_options: Mapping[str, Any],
    allow_incomplete: bool = False,
    patience: int | None = None,
) -> TrainingStore:
    """Open the store and refuse one that cannot be trained on, naming the fix.

    A store without val chips trains (the trainer warns that validation is skipped), but not
    with `patience`, which stops on val mIoU.
    """
    store = open_store(url, storage_options=storage_options)
    summary = store.summary
    if not summary.complete:
        what = (
            f"{url}: the store is incomplete (tiling stopped after {len(summary.sources)} "
            f"source(s), {summary.num_chips} chips)"
        )
        if not allow_incomplete:
            raise TrainingError(
                f"{what}; rerun the same `landcover tile` command to finish it, or pass "
                "--allow-incomplete to train on the chips written so far"
            )
        logger.warning("%s; training on them (--allow-incomplete)", what)
    class_map = summary.class_map
    if not summary.has_labels or class_map is None:
        raise TrainingError(f"{url}: the store has no labels; tile with --labels to train")
    val_ids = store.chip_ids("val")
    if len(val_ids) == 0 and patience is not None:
        raise TrainingError(
            f"--patience {patience} stops on val mIoU but {url} has no val chips; drop "
            "--patience, or re-tile with --val-fraction > 0"
        )
    return TrainingStore(url, summary, class_map, store.chip_ids("train"), val_ids)


def check_local_training(
    config: TrainConfig, *, world_sizes: Iterable[int], check_out_dir: bool = True
) -> TrainingStore:
    """The parent's checks before starting local workers, for each world size to be run.

    `check_out_dir=False` when the launcher owns the run dirs (a sweep replaces its own)."""
    if check_out_dir and "://" not in config.out_dir:
        check_run_dir(config.out_dir, resume=config.resume, overwrite=config.overwrite)
    store = open_training_store(
        config.store_url,
        storage_options=config.storage_options,
        allow_incomplete=config.allow_incomplete,
        patience=config.patience,
    )
    for world_size in world_sizes:
        store.steps_per_epoch(world_size=world_size, batch_size=config.batch_size)
    from landcover.models.registry import check_model_name  # torch: as the workers will

    check_model_name(config.model)
    if check_out_dir and "://" not in config.out_dir:
        from landcover.training.resume import check_local_resume  # torch: the checkpoint

        check_local_resume(config, store.summary)
    return store
