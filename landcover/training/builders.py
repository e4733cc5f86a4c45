"""Everything a training worker builds before its first step: the chip store and the data
(this rank's shards, loaded once and timed), the model, and the optimizer with its learning-rate
schedule. `landcover.training.worker.train` calls them in order and hands the results to the
`Trainer`; the sync strategy is `landcover.training.sync`, the resume state
`landcover.training.resume`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from landcover.data.shards import ShardDataset
from landcover.errors import TrainingError
from landcover.models.registry import build_model as build_registered
from landcover.models.smp_models import check_chip_size
from landcover.training.config import TrainConfig
from landcover.training.distributed import (
    Collectives,
    DistEnv,
    available_memory_bytes,
    check_shard_fits,
)
from landcover.training.losses import class_weights_from_counts
from landcover.training.preflight import TrainingStore, open_training_store
from landcover.training.resume import ResumeState, load_optimizer_state, store_identity
from landcover.training.schedule import LrSchedule, build_optimizer
from tiling.chipstore.store import load_shard_into_memory, shard_bytes
from tiling.errors import StorageAccessError
from tiling.runtime.urls import check_storage_options

__all__ = [
    "Optimization",
    "TrainingData",
    "build_model",
    "build_optimization",
    "load_training_data",
    "open_store_for_training",
]

logger = logging.getLogger(__name__)


def open_store_for_training(
    config: TrainConfig, env: DistEnv
) -> tuple[TrainingStore, dict[str, Any]]:
    """The checked store (`open_training_store`, the checks a parent also runs) and its
    identity (`store_identity`); rank 0 warns about storage options and a missing val split."""
    store = open_training_store(
        config.store_url,
        storage_options=config.storage_options,
        allow_incomplete=config.allow_incomplete,
        patience=config.patience,
    )
    if env.is_main:
        try:
            check_storage_options([config.store_url, config.out_dir], config.storage_options)
        except StorageAccessError as exc:
            # A warning, not tile's error: launchers hand one set of options to every job.
            logger.warning("%s (ignored)", exc)
        if len(store.val_ids) == 0:
            logger.warning(
                "%s has no val chips: validation is skipped and model.pt is the last epoch's "
                "model; re-tile with --val-fraction > 0 to validate",
                store.url,
            )
    return store, store_identity(store.url, store.summary)


def build_model(
    config: TrainConfig, store: TrainingStore, device: torch.device, *, channels_last: bool
) -> nn.Module:
    """The model of `--model` on `device`, the same initial weights on every rank (seeded);
    TrainingError when the store's chip size does not suit it."""

    torch.manual_seed(config.seed)
    model = build_registered(
        config.model,
        in_channels=len(store.summary.band_mean),
        num_classes=int(store.class_map.num_classes),
        pretrained=config.pretrained,
    )
    check_chip_size(model, config.model, int(store.summary.chip_size))
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


@dataclass(frozen=True, slots=True)
class TrainingData:
    """This rank's shards in memory and what the loop needs to know about the store."""

    store: TrainingStore
    identity: dict[str, Any]  # store_identity: recorded in run.json and checkpoints
    train: ShardDataset
    val: ShardDataset | None  # None: the store has no val chips
    steps: int  # per epoch, the same on every rank
    load_time_s: float  # slowest rank's shard load
    load_bytes: int
    class_weights: torch.Tensor | None

    @property
    def num_classes(self) -> int:
        return int(self.store.class_map.num_classes)


def load_training_data(
    config: TrainConfig,
    env: DistEnv,
    collectives: Collectives,
    device: torch.device,
    *,
    store: TrainingStore,
    identity: dict[str, Any],
    steps: int,
) -> TrainingData:
    """Check that this node's shards fit in RAM, then load this rank's train and val shards
    ONCE (timed: `load_time_s`, never part of an epoch's time)."""
    summary = store.summary
    splits = ("train", "val") if len(store.val_ids) > 0 else ("train",)

    def need(workers: int) -> int:
        return sum(shard_bytes(summary, world_size=workers, split=s) for s in splits)

    error: str | None = None
    try:
        check_shard_fits(
            need,
            world_size=env.world_size,
            local_world_size=env.local_world_size,
            available_bytes=available_memory_bytes(),
        )
    except TrainingError as exc:
        error = str(exc)
    collectives.raise_if_any(error)
    shards = [
        load_shard_into_memory(
            config.store_url,
            rank=env.rank,
            world_size=env.world_size,
            split=split,
            storage_options=config.storage_options,
        )
        for split in splits
    ]
    load_time_s = sum(float(shard.load_time_s) for shard in shards)
    bytes_read = sum(int(shard.bytes_read) for shard in shards)
    load_time_s, load_bytes = collectives.max_floats([load_time_s, bytes_read])
    # A shard on the GPU makes a batch one index_select; keep it on the host if it would
    # crowd out activations.
    storage = device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if sum(shard.nbytes for shard in shards) >= 0.25 * free:
            storage = torch.device("cpu")
    datasets = []
    for shard in shards:
        if shard.labels is None:
            raise TrainingError(f"{config.store_url}: the store has no labels to train")
        datasets.append(
            ShardDataset(
                shard.images,
                shard.labels,
                band_mean=list(summary.band_mean),
                band_std=list(summary.band_std),
                device=storage,
            )
        )
    train, val = datasets[0], (datasets[1] if len(datasets) > 1 else None)
    logger.info(
        "rank %d: loaded %d train + %d val chips (%.1f MiB) in %.2f s",
        env.rank,
        len(train),
        len(val) if val is not None else 0,
        bytes_read / 2**20,
        load_time_s,
    )
    return TrainingData(
        store=store,
        identity=identity,
        train=train,
        val=val,
        steps=steps,
        load_time_s=load_time_s,
        load_bytes=int(load_bytes),
        class_weights=_class_weights(config, store, train, collectives, device),
    )


def _class_weights(
    config: TrainConfig,
    store: TrainingStore,
    train: ShardDataset,
    collectives: Collectives,
    device: torch.device,
) -> torch.Tensor | None:
    if config.class_weights == "none":
        return None
    num_classes = int(store.class_map.num_classes)
    counts = [int(c) for c in store.summary.class_counts]
    if sum(counts[1:]) == 0:
        # A store without counts: count the train shards (exact for the train split).
        local = torch.bincount(train.labels.flatten().to(torch.int64), minlength=num_classes)
        counts = [int(c) for c in collectives.sum_floats([float(v) for v in local.cpu()])]
    weights = class_weights_from_counts(counts, num_classes)
    logger.info("class weights: %s", ", ".join(f"{w:.2f}" for w in weights))
    return torch.tensor(weights, dtype=torch.float32, device=device)


@dataclass(frozen=True, slots=True)
class Optimization:
    """The optimizer, its schedule in this world, and the scheduler that follows it."""

    optimizer: torch.optim.Optimizer
    schedule: LrSchedule
    scheduler: torch.optim.lr_scheduler.LambdaLR


def build_optimization(
    config: TrainConfig,
    module: nn.Module,
    *,
    world_size: int,
    steps_per_epoch: int,
    resume: ResumeState,
) -> Optimization:
    """Optimizer and schedule for the world this run has (`landcover.training.schedule`);
    a resumed run's optimizer state (this rank's own under BMUF), and its schedule positioned
    at the next epoch."""
    block_momentum = config.block_momentum and world_size > 1
    schedule = LrSchedule.for_world(
        base_lr=config.base_lr,
        lr_scaling=config.lr_scaling,
        world_size=world_size,
        block_momentum=block_momentum,
        epochs=config.epochs,
        warmup_epochs=config.warmup_epochs,
        steps_per_epoch=steps_per_epoch,
    )
    optimizer = build_optimizer(
        config.optimizer,
        module.parameters(),
        lr=schedule.peak_lr,
        weight_decay=config.weight_decay,
        momentum_resets=block_momentum and config.reset_local_momentum,
    )
    if resume.optimizer is not None:
        load_optimizer_state(optimizer, resume.optimizer)
    scheduler = schedule.attach(optimizer, epochs_done=resume.start_epoch)
    return Optimization(optimizer, schedule, scheduler)
