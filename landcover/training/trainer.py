"""The training loop of one worker, over objects built beforehand (`landcover.training.worker`):
epochs of `steps` synchronous steps, the same step count on every rank; at the epoch end the
sync strategy makes the model whole (DDP: BatchNorm statistics averaged; BMUF: the partial last
block merged); then validation, whose confusion matrices are summed over ranks; then rank 0
appends a metrics.jsonl line (`EpochRecord`), writes `model.pt` when val mIoU improves (so it
is the best-by-val-mIoU model; without val chips, the last epoch's) and the checkpoint, and
hands the record to the progress line and the trackers (`landcover.training.progress`); every
rank stops early together when `--patience` epochs brought no gain.

Validation, `model.pt` and the checkpoint's `model` are the job's one model
(`SyncStrategy.global_model`). All randomness is a pure function of (seed, epoch, rank):
torch's global RNG is reseeded every epoch, shuffle and augmentation draw from
`derive_seed(seed, epoch, rank)`, so a checkpoint needs no RNG state and a resumed run ends
with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from landcover.data.shards import derive_seed
from landcover.models.modelfile import save_model_file
from landcover.training.builders import Optimization, TrainingData
from landcover.training.checkpoint import save_checkpoint, to_cpu
from landcover.training.config import TrainConfig
from landcover.training.losses import (
    Scores,
    confusion_counts,
    scores_from_confusion,
    segmentation_loss,
)
from landcover.training.outputs import EpochStats, Validation, epoch_record, model_meta
from landcover.training.placement import Placement
from landcover.training.progress import Progress
from landcover.training.records import Checkpoint, EpochRecord
from landcover.training.resume import ResumeState
from landcover.training.rundir import MODEL_FILE, append_metrics, jsonable
from landcover.training.sync import SyncStrategy
from landcover.training.tracking import Tracker

__all__ = ["TrainCallbacks", "TrainResult", "Trainer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainResult:
    run_dir: Path
    epochs_completed: int
    best_epoch: int
    best_val_miou: float
    stopped_early: bool
    metrics: tuple[EpochRecord, ...]


@dataclass(slots=True)
class TrainCallbacks:
    """Hooks for tests and tools; both run on every rank."""

    on_step: Callable[[int, int, torch.nn.Module], None] | None = None  # (epoch, step, model)
    # after the checkpoint: (epoch, the epoch's metrics.jsonl record)
    on_epoch_end: Callable[[int, Mapping[str, Any]], None] | None = None


class Trainer:
    """One worker's loop over built objects; `landcover.training.train` builds them."""

    def __init__(
        self,
        config: TrainConfig,
        place: Placement,
        sync: SyncStrategy,
        optimization: Optimization,
        data: TrainingData,
        resume: ResumeState,
        callbacks: TrainCallbacks,
        tracker: Tracker,
    ) -> None:
        self.config = config
        self.place = place
        self.sync = sync
        self.optimizer = optimization.optimizer
        self.scheduler = optimization.scheduler
        self.peak_lr = optimization.schedule.peak_lr
        self.data = data
        self.callbacks = callbacks
        self.start_epoch = resume.start_epoch
        self.metrics: list[EpochRecord] = list(resume.metrics)
        self.best_val_miou = resume.best_val_miou
        self.best_epoch = resume.best_epoch
        self.epochs_without_improvement = resume.epochs_without_improvement
        self.stopped_early = resume.stopped_early
        self.last_lr = self.peak_lr
        self.progress = Progress(
            tracker,
            is_main=place.env.is_main,
            epochs=config.epochs,
            batch_size=config.batch_size,
            world_size=place.env.world_size,
            log_every=config.log_every,
        )

    def fit(self) -> TrainResult:
        """Train from the epoch after `start_epoch` to `--epochs` or an early stop; the
        trackers finish either way (an exception marks their run failed)."""
        try:
            result = self._fit()
        except BaseException:
            self.progress.finish(failed=True)
            raise
        self.progress.finish(failed=False)
        return result

    def _fit(self) -> TrainResult:
        config, place = self.config, self.place
        if self.stopped_early:
            logger.info(
                "%s stopped early after epoch %d; nothing to do", config.out_dir, self.start_epoch
            )
            return self.result()
        logger.info(
            "training %s on %d chips x %d workers: %d steps/epoch of %d, peak lr %.3g, %s",
            config.model,
            len(self.data.store.train_ids),
            place.env.world_size,
            self.data.steps,
            config.batch_size,
            self.peak_lr,
            place.device_name,
        )
        for epoch in range(self.start_epoch + 1, config.epochs + 1):
            stats = self._train_epoch(epoch)
            validation = self._validate()
            record = epoch_record(
                epoch,
                stats,
                validation,
                config=config,
                place=place,
                data=self.data,
                sync=self.sync,
                lr=self.last_lr,
            )
            miou = validation.scores.miou
            # NaN never improves; without val chips every epoch is the one to keep.
            improved = self.data.val is None or miou > self.best_val_miou
            if improved:
                self.best_val_miou, self.best_epoch = miou, epoch
                self.epochs_without_improvement = 0
            else:
                self.epochs_without_improvement += 1
            self.metrics.append(record)
            stop = (
                config.patience is not None
                and self.epochs_without_improvement >= config.patience
                and epoch < config.epochs
            )
            # Rank 0 decides: every rank must leave the loop after the same epoch.
            self.stopped_early = bool(place.collectives.broadcast_object(stop))
            self._save(epoch, record, improved=improved)
            self.progress.epoch_end(record)
            if self.callbacks.on_epoch_end is not None:
                self.callbacks.on_epoch_end(epoch, record.model_dump())
            if self.stopped_early:
                logger.info(
                    "early stop after epoch %d: no val mIoU gain for %d epochs",
                    epoch,
                    self.epochs_without_improvement,
                )
                break
        return self.result()

    def result(self) -> TrainResult:
        return TrainResult(
            run_dir=Path(self.config.out_dir),
            epochs_completed=len(self.metrics),
            best_epoch=self.best_epoch,
            best_val_miou=self.best_val_miou,
            stopped_early=self.stopped_early,
            metrics=tuple(self.metrics),
        )

    def _train_epoch(self, epoch: int) -> EpochStats:
        config, place, sync, data = self.config, self.place, self.sync, self.data
        # Anything in the model that draws from torch's global RNG (dropout) is then a pure
        # function of (seed, epoch, rank) too.
        torch.manual_seed(derive_seed(config.seed, epoch, place.env.rank, 1))
        sync.module.train()
        if sync.meter is not None:
            sync.meter.reset()
        batches = data.train.epoch_batches(
            batch_size=config.batch_size,
            steps=data.steps,
            seed=config.seed,
            epoch=epoch,
            rank=place.env.rank,
            augment=config.augment,
            brightness_jitter=config.brightness_jitter,
        )
        loss_sum = torch.zeros((), dtype=torch.float64, device=place.device)
        place.collectives.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        progress = self.progress.epoch(epoch, data.steps)
        for step, batch in enumerate(progress.wrap(batches)):
            images, labels = place.to_device(batch)
            with place.autocast():
                logits = sync.model(images)
            loss = segmentation_loss(
                logits.float(),
                labels,
                class_weights=data.class_weights,
                dice=config.loss == "ce+dice",
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            self.last_lr = float(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.scheduler.step()
            sync.after_optimizer_step(self.optimizer)
            loss_sum += loss.detach()
            progress.step(step, loss_sum, self.last_lr)
            if self.callbacks.on_step is not None:
                self.callbacks.on_step(epoch, step, sync.module)
        progress.close()
        # The epoch's last model average (BMUF) or BatchNorm average (DDP) is part of its time.
        sync.end_epoch(self.optimizer)
        if place.device.type == "cuda":
            torch.cuda.synchronize(place.device)
        epoch_time_s = time.perf_counter() - start
        epoch_cpu_s = time.process_time() - start_cpu
        steps = data.steps
        loss_total, epoch_cpu_s = place.collectives.sum_floats(
            [float(loss_sum) / steps, epoch_cpu_s]
        )
        epoch_time_s, data_time_s = place.collectives.max_floats(
            [epoch_time_s, batches.data_time_s / steps]
        )
        return EpochStats(
            epoch_time_s=epoch_time_s,
            epoch_cpu_s=epoch_cpu_s,
            data_time_s=data_time_s,
            train_loss=loss_total / place.env.world_size,
        )

    def _validate(self) -> Validation:
        """The job's model on this rank's val shard, summed with every other rank's."""
        start = time.perf_counter()
        with self.sync.global_model():
            scores, val_loss = self._scores()
        (val_time_s,) = self.place.collectives.max_floats([time.perf_counter() - start])
        return Validation(scores, val_loss, val_time_s)

    @torch.no_grad()
    def _scores(self) -> tuple[Scores, float]:
        """val_loss is the unweighted cross-entropy per labelled pixel, comparable across
        --loss/--class-weights. NaN scores when the store has no val chips (no rank has any:
        nothing to sum)."""
        k, place, val = self.data.num_classes, self.place, self.data.val
        if val is None:
            return Scores(math.nan, math.nan, [None] * k), math.nan
        self.sync.module.eval()
        confusion = torch.zeros(k * k, dtype=torch.int64, device=place.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=place.device)
        pixels = torch.zeros((), dtype=torch.float64, device=place.device)
        for batch in val.sequential_batches(2 * self.config.batch_size):
            images, labels = place.to_device(batch)
            with place.autocast():
                logits = self.sync.module(images).float()
            loss_sum += F.cross_entropy(logits, labels, ignore_index=0, reduction="sum")
            pixels += (labels != 0).sum()
            # Nodata is never a prediction: argmax over the real classes only.
            pred = logits[:, 1:].argmax(dim=1) + 1
            confusion += confusion_counts(pred, labels, k)
        comms = place.collectives
        totals = comms.sum_(torch.stack([loss_sum, pixels]).to(comms.device))
        confusion = comms.sum_(confusion.to(comms.device))
        val_loss = float(totals[0] / totals[1]) if float(totals[1]) > 0 else math.nan
        scores = scores_from_confusion(confusion.cpu().numpy().reshape(k, k))
        return scores, val_loss

    def _save(self, epoch: int, record: EpochRecord, *, improved: bool) -> None:
        """metrics line, model.pt (when improved, or when none exists), then the checkpoint."""
        per_rank = self.place.collectives.gather_to_main(self.sync.own_state(self.optimizer))
        if not self.place.env.is_main or per_rank is None:
            return
        out = Path(self.config.out_dir)
        append_metrics(out, record.model_dump())
        with self.sync.global_model():
            model_path = out / MODEL_FILE
            if improved or not model_path.exists():
                meta = model_meta(
                    epoch,
                    record,
                    config=self.config,
                    data=self.data,
                    world_size=self.place.env.world_size,
                    peak_lr=self.peak_lr,
                )
                save_model_file(model_path, self.sync.module, meta)
            model_state = to_cpu(self.sync.module.state_dict())
        checkpoint = Checkpoint(
            epoch=epoch,
            world_size=self.place.env.world_size,
            config=self.config.to_json(),
            model=model_state,
            optimizer=to_cpu(self.optimizer.state_dict()),
            scheduler=self.scheduler.state_dict(),
            per_rank=per_rank,
            store=self.data.identity,
            bmuf=self.sync.shared_state(),
            best_val_miou=self.best_val_miou,
            best_epoch=self.best_epoch,
            epochs_without_improvement=self.epochs_without_improvement,
            stopped_early=self.stopped_early,
            metrics=[jsonable(record.model_dump()) for record in self.metrics],
            seed=self.config.seed,
        )
        save_checkpoint(out, checkpoint.to_payload())
