"""What a training worker records: the epoch's `EpochRecord` (a metrics.jsonl line),
the `ModelMeta` that makes `model.pt` self-describing, and run.json (`RunInfo`), from the built
objects of `landcover.training.worker`. Rank 0 writes them (`landcover.training.rundir`)."""

from __future__ import annotations

import importlib.metadata
import logging
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from landcover.comm.counts import CommCounts
from landcover.models.modelfile import ModelMeta
from landcover.training.builders import Optimization, TrainingData
from landcover.training.config import TrainConfig
from landcover.training.losses import Scores
from landcover.training.placement import Placement
from landcover.training.records import EpochRecord, RunInfo
from landcover.training.resume import ResumeState
from landcover.training.rundir import jsonable, utc_now, write_run_json
from landcover.training.sync import SyncStrategy
from landcover.version import __version__
from tiling.runtime.machine import local_cpu_count
from tiling.runtime.urls import is_local, local_path

__all__ = ["EpochStats", "epoch_record", "model_meta", "write_run_info"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpochStats:
    """An epoch's training steps, reduced over the ranks."""

    epoch_time_s: float  # slowest rank
    epoch_cpu_s: float  # summed over ranks
    data_time_s: float  # per step, slowest rank
    train_loss: float  # mean over ranks


@dataclass(frozen=True, slots=True)
class Validation:
    """The job's model on the val chips, summed over ranks (NaN without val chips)."""

    scores: Scores
    val_loss: float
    val_time_s: float


def epoch_record(
    epoch: int,
    stats: EpochStats,
    validation: Validation,
    *,
    config: TrainConfig,
    place: Placement,
    data: TrainingData,
    sync: SyncStrategy,
    lr: float,
) -> EpochRecord:
    """The epoch's metrics.jsonl record (docs/CONTRACTS.md); `landcover.training.progress`
    logs it as one line."""
    steps, world_size = data.steps, place.env.world_size
    samples = steps * config.batch_size * world_size
    meter, scores = sync.meter, validation.scores
    counts = meter.counts_per_step() if meter is not None else CommCounts()
    samples_per_s = samples / stats.epoch_time_s
    step_time_s = stats.epoch_time_s / steps
    record = EpochRecord(
        epoch=epoch,
        world_size=world_size,
        nodes=place.env.nodes,
        epoch_time_s=stats.epoch_time_s,
        # CPU seconds of the training steps, summed over ranks: unlike wall time, barely
        # moved by other work on a shared machine.
        epoch_cpu_s=stats.epoch_cpu_s,
        load_time_s=data.load_time_s,
        val_time_s=validation.val_time_s,
        train_loss=stats.train_loss,
        val_loss=validation.val_loss,
        val_miou=scores.miou,
        val_accuracy=scores.accuracy,
        per_class_iou=scores.per_class_iou,
        samples_per_s=samples_per_s,
        pixels_per_s=samples * data.train.chip_size**2 / stats.epoch_time_s,
        step_time_s=step_time_s,
        data_time_s=stats.data_time_s,
        steps=steps,
        comm_bytes_per_step=float(meter.bytes_per_step()) if meter is not None else 0.0,
        comm_time_s=float(meter.time_per_step_s()) if meter is not None else 0.0,
        compression=sync.compression,
        block_momentum=config.block_momentum,
        model=config.model,
        batch_size=config.batch_size,
        device=place.device_name,
        threads_per_worker=place.threads,
        host=place.host,
        lr=lr,  # of the epoch's last step
        time=utc_now(),
        comm_allreduce_per_step=counts.allreduce_per_step,
        comm_allreduce_bytes_per_step=counts.allreduce_bytes_per_step,
        comm_allgather_per_step=counts.allgather_per_step,
        comm_allgather_bytes_per_step=counts.allgather_bytes_per_step,
        comm_broadcast_per_step=counts.broadcast_per_step,
        comm_broadcast_bytes_per_step=counts.broadcast_bytes_per_step,
        comm_buckets_per_step=counts.buckets_per_step,
    )
    return record


def model_meta(
    epoch: int,
    record: EpochRecord,
    *,
    config: TrainConfig,
    data: TrainingData,
    world_size: int,
    peak_lr: float,
) -> ModelMeta:
    """What model.pt says about the model of `epoch` and how it was trained."""
    summary = data.store.summary
    training = {
        "epoch": epoch,
        "epochs": config.epochs,
        "val_miou": record.val_miou,
        "val_accuracy": record.val_accuracy,
        "per_class_iou": record.per_class_iou,
        "world_size": world_size,
        "batch_size": config.batch_size,
        "optimizer": config.optimizer,
        "peak_lr": peak_lr,
        "loss": config.loss,
        "seed": config.seed,
        # absolute: predict --precision int8 calibrates on it by default from any directory,
        # where a relative path would name another store or none
        "store": _absolute(config.store_url),
        "train_chips": len(data.store.train_ids),
        "time": utc_now(),
    }
    return ModelMeta(
        architecture=config.model,
        class_map=data.store.class_map,
        band_names=tuple(summary.bands),
        band_mean=tuple(float(v) for v in summary.band_mean),
        band_std=tuple(float(v) for v in summary.band_std),
        chip_size=int(summary.chip_size),
        resolution_m=float(summary.resolution_m or 0.0),
        training=jsonable(training),
    )


def write_run_info(
    config: TrainConfig,
    place: Placement,
    data: TrainingData,
    optimization: Optimization,
    resume: ResumeState,
    ranks: list[dict[str, Any]],
) -> None:
    """run.json (rank 0, once per process start); `ranks` is every rank's `Placement.where`."""
    env, schedule = place.env, optimization.schedule
    versions = {
        "landcover": __version__,
        "torch": torch.__version__,
        # from the metadata: importing torchvision takes seconds
        "torchvision": importlib.metadata.version("torchvision"),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    store: dict[str, Any] = {**data.identity, "summary": jsonable(data.store.summary)}
    info = RunInfo(
        world_size=env.world_size,
        nodes=env.nodes,
        local_world_size=env.local_world_size,
        threads_per_worker=place.threads,
        interop_threads=torch.get_num_interop_threads(),
        cores=local_cpu_count(),
        device=place.device_name,
        amp=place.amp,
        host=place.host,
        versions=versions,
        store=store,
        config=config.to_json(),
        train_chips=len(data.store.train_ids),
        val_chips=len(data.store.val_ids),
        steps_per_epoch=data.steps,
        peak_lr=schedule.peak_lr,
        warmup_steps=schedule.warmup_steps,
        total_steps=schedule.total_steps,
        load_time_s=data.load_time_s,
        load_bytes=data.load_bytes,
        resumed_from_epoch=resume.start_epoch or None,
        started=utc_now(),
        ranks=ranks,
    )
    write_run_json(config.out_dir, info.model_dump())


def _absolute(url: str) -> str:
    """`url` with a local path made absolute (a remote URL as it is)."""
    return str(local_path(url).resolve()) if is_local(url) else url
