"""Synchronous data-parallel training on a chip store.

`python -m landcover.training STORE --out RUN_DIR [options]` is the worker entry point for every
launcher (torchrun, Azure ML, Kubeflow); `landcover train` runs it in-process or spawns N local
workers through torchrun. One `train(config)` call is one worker:

1. rank 0 checks the run dir (refuses old results unless `--resume`/`--overwrite`);
2. every rank checks that its shard fits in RAM, then loads its train and val shards ONCE
   (timed: `load_time_s`, never part of `epoch_time_s`);
3. epochs of `steps` synchronous steps (DDP with a comm hook, or BMUF), the same step count on
   every rank; at the epoch end the ranks' BatchNorm statistics are averaged (BMUF: the partial
   last block is merged, which averages them too); then validation whose confusion matrices
   are summed over ranks;
4. rank 0 appends a `metrics.jsonl` line, writes `model.pt` when val mIoU improves (so
   `model.pt` is the best-by-val-mIoU model; without val chips, the last epoch's) and writes
   `checkpoints/last.pt` atomically (`landcover.training.rundir`).

Validation, `model.pt` and the checkpoint's `model` are the job's one model: the replicas under
DDP, BMUF's block-level global model under `--block-momentum` (`BlockMomentum.global_model`;
each learner's own model and optimizer state go into the checkpoint's per-rank part, the
block-level state, the same on every rank, into its `bmuf` entry once). BatchNorm statistics
are every rank's: DDP runs with `broadcast_buffers=False`, so each rank's running statistics
follow its own shard through the epoch (rank 0's would describe 1/N of the data), and the
epoch-end average holds all of it. `--sync-bn` (CUDA only) normalises with the statistics of
the global batch instead.

Learning rate: `landcover.training.schedule` (peak = base lr x a function of the world size,
warm-up,
cosine to 1 % of the peak at the end), always derived for the world this run has.

Resume (`landcover.training.resume`) refuses a checkpoint of another store or sync mode, and derives
steps, peak lr and schedule for the current world size, continuing at the next epoch. It is
exact: all randomness is a pure function of (seed, epoch, rank) (model init from the seed,
shuffle and augmentation from `derive_seed(seed, epoch, rank)`, torch's global RNG reseeded
every epoch), so a checkpoint needs no RNG state, and at an unchanged world size a resumed run
ends with the same weights as an uninterrupted one (bitwise on CPU with the same thread count).
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import os
import platform
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import landcover
from landcover.data.shards import Batch, ShardDataset, derive_seed
from landcover.errors import TrainingError
from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.training.config import TrainConfig
from landcover.training.distributed import (
    Collectives,
    DistEnv,
    available_memory_bytes,
    check_shard_fits,
    check_sync_bn,
    configure_threads,
    device_description,
    process_group,
    read_dist_env,
    resolve_device,
)
from landcover.training.losses import (
    Scores,
    class_weights_from_counts,
    confusion_counts,
    scores_from_confusion,
    segmentation_loss,
)
from landcover.training.resume import (
    load_optimizer_state,
    read_resumable_checkpoint,
    store_identity,
)
from landcover.training.rundir import (
    MODEL_FILE,
    append_metrics,
    jsonable,
    prepare_run_dir,
    rewrite_metrics,
    save_checkpoint,
    to_cpu,
    utc_now,
    write_run_json,
)
from landcover.training.schedule import LrSchedule, build_optimizer
from tiling.errors import StorageAccessError
from tiling.urls import check_storage_options

if TYPE_CHECKING:
    from landcover.comm import CommMeter
    from landcover.comm.bmuf import BlockMomentum

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainResult:
    run_dir: Path
    epochs_completed: int
    best_epoch: int
    best_val_miou: float
    stopped_early: bool
    metrics: tuple[Mapping[str, Any], ...]


@dataclass(slots=True)
class TrainCallbacks:
    """Hooks for tests and tools; both run on every rank."""

    on_step: Callable[[int, int, nn.Module], None] | None = None  # (epoch, step, model)
    on_epoch_end: Callable[[int, Mapping[str, Any]], None] | None = None  # after the checkpoint


def train(
    config: TrainConfig,
    *,
    dist_env: DistEnv | None = None,
    callbacks: TrainCallbacks | None = None,
) -> TrainResult:
    """Run one training worker (the whole job when the world is one process)."""
    env = read_dist_env() if dist_env is None else dist_env
    threads = configure_threads(config.threads, env.local_world_size)
    device = resolve_device(config.device, env)
    check_sync_bn(config.sync_bn, env, device)
    with process_group(env, device) as collectives:
        trainer = Trainer(config, env, collectives, device, threads, callbacks or TrainCallbacks())
        return trainer.run()


@dataclass(frozen=True, slots=True)
class _EpochStats:
    epoch_time_s: float
    epoch_cpu_s: float
    data_time_s: float
    train_loss: float


class Trainer:
    """One worker's training loop; build with `train()`."""

    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        collectives: Collectives,
        device: torch.device,
        threads: int,
        callbacks: TrainCallbacks,
    ) -> None:
        self.config = config
        self.env = env
        self.comms = collectives
        self.device = device
        self.threads = threads
        self.callbacks = callbacks
        self.out = Path(config.out_dir)
        self.amp = device.type == "cuda" if config.amp is None else config.amp
        self.channels_last = device.type == "cuda"
        self.device_name = device_description(device)
        self.host = socket.gethostname()
        self.metrics: list[dict[str, Any]] = []
        self.best_val_miou = -math.inf
        self.best_epoch = 0
        self.epochs_without_improvement = 0
        self.start_epoch = 0  # epochs done before this process started (resume)
        self.stopped_early = False

    # -- setup ----------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        checkpoint_path = self._prepare_run_dir()
        self._open_store()
        # Before the long load: a bad --model or --pretrained, or a checkpoint this run cannot
        # continue, fails fast.
        self._build_model()
        common, own = self._read_checkpoint(checkpoint_path)
        self._load_shards()
        self._build_parallel_model(common, own)
        self._build_optimizer(common, own)
        if self.env.is_main:
            self._write_run_json()
        return self._fit()

    def _prepare_run_dir(self) -> Path | None:
        """Rank 0 checks and resets the run dir; every rank learns whether to resume."""
        error: str | None = None
        checkpoint: Path | None = None
        if self.env.is_main:
            try:
                checkpoint = prepare_run_dir(
                    self.out, resume=self.config.resume, overwrite=self.config.overwrite
                )
            except (TrainingError, OSError) as exc:
                error = str(exc)
        self.comms.raise_if_any(error)
        return self.comms.broadcast_object(checkpoint)

    def _open_store(self) -> None:
        from landcover.training.preflight import (
            open_training_store,  # the checks a parent also runs
        )

        store = open_training_store(
            self.config.store_url,
            storage_options=self.config.storage_options,
            allow_incomplete=self.config.allow_incomplete,
            patience=self.config.patience,
        )
        if self.env.is_main:
            try:
                check_storage_options(
                    [self.config.store_url, self.config.out_dir], self.config.storage_options
                )
            except StorageAccessError as exc:
                # A warning, not tile's error: launchers hand one set of options to every job.
                logger.warning("%s (ignored)", exc)
        if len(store.val_ids) == 0 and self.env.is_main:
            logger.warning(
                "%s has no val chips: validation is skipped and model.pt is the last epoch's "
                "model; re-tile with --val-fraction > 0 to validate",
                store.url,
            )
        self.steps = store.steps_per_epoch(
            world_size=self.env.world_size, batch_size=self.config.batch_size
        )
        self.summary = store.summary
        self.class_map = store.class_map
        self.num_classes = int(store.class_map.num_classes)
        self.num_train, self.num_val = len(store.train_ids), len(store.val_ids)
        self.store = store_identity(store.url, store.summary)

    def _load_shards(self) -> None:
        from tiling.store import load_shard_into_memory, shard_bytes

        splits = ("train", "val") if self.num_val > 0 else ("train",)

        def need(workers: int) -> int:
            return sum(shard_bytes(self.summary, world_size=workers, split=s) for s in splits)

        error: str | None = None
        try:
            check_shard_fits(
                need,
                world_size=self.env.world_size,
                local_world_size=self.env.local_world_size,
                available_bytes=available_memory_bytes(),
            )
        except TrainingError as exc:
            error = str(exc)
        self.comms.raise_if_any(error)

        shards = [
            load_shard_into_memory(
                self.config.store_url,
                rank=self.env.rank,
                world_size=self.env.world_size,
                split=split,
                storage_options=self.config.storage_options,
            )
            for split in splits
        ]
        load_time_s = sum(float(shard.load_time_s) for shard in shards)
        bytes_read = sum(int(shard.bytes_read) for shard in shards)
        self.load_time_s, self.load_bytes = self.comms.max_floats([load_time_s, bytes_read])
        # A shard on the GPU makes a batch one index_select; keep it on the host if it would
        # crowd out activations.
        storage = self.device
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if sum(shard.nbytes for shard in shards) >= 0.25 * free:
                storage = torch.device("cpu")
        datasets = []
        for shard in shards:
            if shard.labels is None:
                raise TrainingError(f"{self.config.store_url}: the store has no labels to train")
            datasets.append(
                ShardDataset(
                    shard.images,
                    shard.labels,
                    band_mean=list(self.summary.band_mean),
                    band_std=list(self.summary.band_std),
                    device=storage,
                )
            )
        self.train_data = datasets[0]
        self.val_data: ShardDataset | None = datasets[1] if len(datasets) > 1 else None
        logger.info(
            "rank %d: loaded %d train + %d val chips (%.1f MiB) in %.2f s",
            self.env.rank,
            len(self.train_data),
            len(self.val_data) if self.val_data is not None else 0,
            bytes_read / 2**20,
            load_time_s,
        )
        self.class_weight_tensor = self._class_weights()

    def _class_weights(self) -> torch.Tensor | None:
        if self.config.class_weights == "none":
            return None
        counts = [int(c) for c in self.summary.class_counts]
        if sum(counts[1:]) == 0:
            # A store without counts: count the train shards (exact for the train split).
            local = torch.bincount(
                self.train_data.labels.flatten().to(torch.int64), minlength=self.num_classes
            )
            counts = [int(c) for c in self.comms.sum_floats([float(v) for v in local.cpu()])]
        weights = class_weights_from_counts(counts, self.num_classes)
        logger.info("class weights: %s", ", ".join(f"{w:.2f}" for w in weights))
        return torch.tensor(weights, dtype=torch.float32, device=self.device)

    def _build_model(self) -> None:
        from landcover.models.registry import build_model

        torch.manual_seed(self.config.seed)  # the same initial weights on every rank
        model = build_model(
            self.config.model,
            in_channels=len(self.summary.band_mean),
            num_classes=self.num_classes,
            pretrained=self.config.pretrained,
        )
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.module: nn.Module = model

    def _read_checkpoint(self, path: Path | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Rank 0 reads the checkpoint; every rank gets the common part and its own part."""
        if path is None:
            return None, {}
        payload: dict[str, Any] | None = None
        per_rank: list[dict[str, Any]] | None = None
        error: str | None = None
        if self.env.is_main:
            try:
                payload, per_rank = read_resumable_checkpoint(
                    path,
                    config=self.config.to_json(),
                    store=self.store,
                    world_size=self.env.world_size,
                )
            except TrainingError as exc:
                error = str(exc)
        self.comms.raise_if_any(error)
        common = self.comms.broadcast_object(payload)
        own = self.comms.scatter_from_main(per_rank)
        assert common is not None  # rank 0 raised otherwise
        if not self.config.block_momentum:
            # Per-rank models and optimizers are BMUF's learners; DDP replicas share one.
            own = {key: value for key, value in own.items() if key == "comm"}
        try:
            self.module.load_state_dict(own.get("model", common["model"]))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise TrainingError(
                f"{path}: checkpoint does not fit {self.config.model} ({first}); "
                "pass --overwrite to start over"
            ) from None
        self.start_epoch = int(common["epoch"])
        self.best_val_miou = float(common["best_val_miou"])
        self.best_epoch = int(common["best_epoch"])
        self.epochs_without_improvement = int(common["epochs_without_improvement"])
        self.stopped_early = bool(common.get("stopped_early", False))
        self.metrics = [dict(m) for m in common["metrics"]]
        if self.env.is_main:
            # A worker killed after an epoch's metrics line but before its checkpoint left a
            # line the checkpoint does not know; that epoch runs again.
            rewrite_metrics(self.out, self.metrics)
        logger.info("resuming %s after epoch %d", self.out, self.start_epoch)
        return common, own

    def _build_parallel_model(
        self, common: Mapping[str, Any] | None, own: Mapping[str, Any]
    ) -> None:
        from landcover.comm import install_comm_hook, parse_compression
        from landcover.comm.bmuf import BlockMomentum

        config = self.config
        spec = parse_compression(config.compression)
        self.compression = str(spec)  # normalised: "powersgd" -> "powersgd:2"
        self.bmuf: BlockMomentum | None = None
        self.meter: CommMeter | None = None
        self.model: nn.Module = self.module
        if not self.env.is_distributed:
            if config.compression != "none" or config.block_momentum:
                logger.warning("one worker: --compression/--block-momentum have nothing to do")
            return
        if config.sync_bn:  # CUDA only (check_sync_bn); parameters and buffers carry over
            convert = nn.SyncBatchNorm.convert_sync_batchnorm
            self.module = self.model = convert(self.module)  # type: ignore[no-untyped-call]
        if config.block_momentum:
            if "model" not in own:  # fresh start: every learner from rank 0's weights
                self.comms.broadcast_module(self.module)
            self.bmuf = BlockMomentum(
                self.module,
                block_size=config.block_size,
                momentum=config.block_momentum_value,
                block_lr=config.block_lr,
                nesterov=config.nesterov,
            )
            self.meter = self.bmuf.meter
            # Only with the learners' own models: a checkpoint from another world size or a
            # DDP run starts the block-level state afresh from the model just loaded.
            if common is not None and "model" in own:
                # Checkpoints before the block-level state moved into the common part kept it
                # per rank.
                self.bmuf.load_state_dict(common.get("bmuf") or own["comm"])
            return
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # Each rank keeps its own BatchNorm statistics through the epoch, averaged at its end
        # (`_end_epoch`); broadcasting rank 0's before every forward would throw the others'
        # away. Training itself normalises with batch statistics and never reads them.
        with warnings.catch_warnings():
            # torch 2.15 deprecates broadcast_buffers but its replacement still syncs buffers
            # at init, and its own warning says to keep broadcast_buffers=False until
            # init_sync_buffers exists.
            warnings.filterwarnings(
                "ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning
            )
            self.model = DistributedDataParallel(
                self.module, device_ids=device_ids, broadcast_buffers=False
            )
        self.meter = install_comm_hook(self.model, spec)
        if own.get("comm") is not None:
            self.meter.load_state_dict(own["comm"])

    def _build_optimizer(self, common: Mapping[str, Any] | None, own: Mapping[str, Any]) -> None:
        config = self.config
        self.schedule = LrSchedule.for_world(
            base_lr=config.base_lr,
            lr_scaling=config.lr_scaling,
            world_size=self.env.world_size,
            block_momentum=self.bmuf is not None,
            epochs=config.epochs,
            warmup_epochs=config.warmup_epochs,
            steps_per_epoch=self.steps,
        )
        self.peak_lr = self.schedule.peak_lr
        self.optimizer = build_optimizer(
            config.optimizer,
            self.module.parameters(),
            lr=self.peak_lr,
            weight_decay=config.weight_decay,
            momentum_resets=self.bmuf is not None and config.reset_local_momentum,
        )
        if common is not None:
            load_optimizer_state(self.optimizer, own.get("optimizer", common["optimizer"]))
        self.scheduler = self.schedule.attach(self.optimizer, epochs_done=self.start_epoch)

    def _write_run_json(self) -> None:
        summary = self.summary
        write_run_json(
            self.out,
            {
                "world_size": self.env.world_size,
                "nodes": self.env.nodes,
                "local_world_size": self.env.local_world_size,
                "threads_per_worker": self.threads,
                "interop_threads": torch.get_num_interop_threads(),
                "cores": os.cpu_count(),
                "device": self.device_name,
                "amp": self.amp,
                "host": self.host,
                "versions": {
                    "landcover": landcover.__version__,
                    "torch": torch.__version__,
                    # from the metadata: importing torchvision takes seconds
                    "torchvision": importlib.metadata.version("torchvision"),
                    "numpy": np.__version__,
                    "python": platform.python_version(),
                },
                "store": {**self.store, "summary": summary},
                "config": self.config.to_json(),
                "train_chips": self.num_train,
                "val_chips": self.num_val,
                "steps_per_epoch": self.steps,
                "peak_lr": self.peak_lr,
                "warmup_steps": self.schedule.warmup_steps,
                "total_steps": self.schedule.total_steps,
                "load_time_s": self.load_time_s,
                "load_bytes": int(self.load_bytes),
                "resumed_from_epoch": self.start_epoch or None,
                "started": utc_now(),
            },
        )

    # -- the loop -------------------------------------------------------------------------------

    def _fit(self) -> TrainResult:
        config = self.config
        if self.stopped_early:
            logger.info(
                "%s stopped early after epoch %d; nothing to do", self.out, self.start_epoch
            )
            return self._result()
        logger.info(
            "training %s on %d chips x %d workers: %d steps/epoch of %d, peak lr %.3g, %s",
            config.model,
            self.num_train,
            self.env.world_size,
            self.steps,
            config.batch_size,
            self.peak_lr,
            self.device_name,
        )
        for epoch in range(self.start_epoch + 1, config.epochs + 1):
            record = self._record(epoch, self._train_epoch(epoch))
            # NaN never improves; without val chips every epoch is the one to keep.
            improved = self.val_data is None or record["val_miou"] > self.best_val_miou
            if improved:
                self.best_val_miou, self.best_epoch = record["val_miou"], epoch
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
            self.stopped_early = bool(self.comms.broadcast_object(stop))
            self._save(epoch, record, improved=improved)
            if self.callbacks.on_epoch_end is not None:
                self.callbacks.on_epoch_end(epoch, record)
            if self.stopped_early:
                logger.info(
                    "early stop after epoch %d: no val mIoU gain for %d epochs",
                    epoch,
                    self.epochs_without_improvement,
                )
                break
        return self._result()

    def _result(self) -> TrainResult:
        return TrainResult(
            run_dir=self.out,
            epochs_completed=len(self.metrics),
            best_epoch=self.best_epoch,
            best_val_miou=self.best_val_miou,
            stopped_early=self.stopped_early,
            metrics=tuple(self.metrics),
        )

    def _global_model(self) -> AbstractContextManager[None]:
        """The job's one model in `self.module`: BMUF's block-level global model for the
        duration (each learner's local model back afterwards); the DDP replicas already are."""
        return self.bmuf.global_model() if self.bmuf is not None else nullcontext()

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.amp and self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _to_device(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        images = batch.images.to(self.device, non_blocking=True)
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, batch.labels.to(self.device, non_blocking=True)

    def _train_epoch(self, epoch: int) -> _EpochStats:
        from landcover.comm.bmuf import reset_local_momentum

        config = self.config
        # Anything in the model that draws from torch's global RNG (dropout) is then a pure
        # function of (seed, epoch, rank) too.
        torch.manual_seed(derive_seed(config.seed, epoch, self.env.rank, 1))
        self.module.train()
        if self.meter is not None:
            self.meter.reset()
        batches = self.train_data.epoch_batches(
            batch_size=config.batch_size,
            steps=self.steps,
            seed=config.seed,
            epoch=epoch,
            rank=self.env.rank,
            augment=config.augment,
        )
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.comms.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        for step, batch in enumerate(self._progress(batches, epoch)):
            images, labels = self._to_device(batch)
            with self._autocast():
                logits = self.model(images)
            loss = segmentation_loss(
                logits.float(),
                labels,
                class_weights=self.class_weight_tensor,
                dice=config.loss == "ce+dice",
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            self.last_lr = float(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.scheduler.step()
            # The block end's model average happens whether or not the momentum is reset.
            block_ended = self.bmuf is not None and self.bmuf.after_optimizer_step()
            if block_ended and config.reset_local_momentum:
                reset_local_momentum(self.optimizer)
            loss_sum += loss.detach()
            if self.callbacks.on_step is not None:
                self.callbacks.on_step(epoch, step, self.module)
        # The epoch's last model average (BMUF) or BatchNorm average (DDP) is part of its time.
        self._end_epoch()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        epoch_time_s = time.perf_counter() - start
        epoch_cpu_s = time.process_time() - start_cpu
        loss_total, epoch_cpu_s = self.comms.sum_floats([float(loss_sum) / self.steps, epoch_cpu_s])
        epoch_time_s, data_time_s = self.comms.max_floats(
            [epoch_time_s, batches.data_time_s / self.steps]
        )
        return _EpochStats(
            epoch_time_s=epoch_time_s,
            epoch_cpu_s=epoch_cpu_s,
            data_time_s=data_time_s,
            train_loss=loss_total / self.env.world_size,
        )

    def _end_epoch(self) -> None:
        """Make the epoch's model whole before anyone looks at it: BMUF merges the partial last
        block into the global model (a model average, BatchNorm statistics included); DDP
        averages the BatchNorm statistics, which each rank gathered from its own shard."""
        from landcover.comm.bmuf import reset_local_momentum

        if self.bmuf is not None:
            if self.bmuf.end_block() and self.config.reset_local_momentum:
                reset_local_momentum(self.optimizer)
        else:
            self.comms.average_float_buffers(self.module)

    def _progress(self, batches: Iterable[Batch], epoch: int) -> Iterator[Batch]:
        if not (self.env.is_main and sys.stderr.isatty()):
            return iter(batches)
        from tqdm.auto import tqdm

        bar: Iterator[Batch] = tqdm(
            batches, desc=f"epoch {epoch}/{self.config.epochs}", unit="step", leave=False
        )
        return bar

    @torch.no_grad()
    def _validate(self) -> tuple[Scores, float]:
        """Scores of this rank's val shard summed with every other rank's. val_loss is the
        unweighted cross-entropy per labelled pixel, comparable across --loss/--class-weights.
        NaN scores when the store has no val chips (no rank has any: nothing to sum)."""
        k = self.num_classes
        if self.val_data is None:
            return Scores(float("nan"), float("nan"), [None] * k), float("nan")
        self.module.eval()
        confusion = torch.zeros(k * k, dtype=torch.int64, device=self.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        pixels = torch.zeros((), dtype=torch.float64, device=self.device)
        for batch in self.val_data.sequential_batches(2 * self.config.batch_size):
            images, labels = self._to_device(batch)
            with self._autocast():
                logits = self.module(images).float()
            loss_sum += F.cross_entropy(logits, labels, ignore_index=0, reduction="sum")
            pixels += (labels != 0).sum()
            # Nodata is never a prediction: argmax over the real classes only.
            pred = logits[:, 1:].argmax(dim=1) + 1
            confusion += confusion_counts(pred, labels, k)
        totals = self.comms.sum_(torch.stack([loss_sum, pixels]).to(self.comms.device))
        confusion = self.comms.sum_(confusion.to(self.comms.device))
        val_loss = float(totals[0] / totals[1]) if float(totals[1]) > 0 else float("nan")
        scores = scores_from_confusion(confusion.cpu().numpy().reshape(k, k))
        return scores, val_loss

    def _record(self, epoch: int, stats: _EpochStats) -> dict[str, Any]:
        """Validate the job's model, then the epoch's metrics.jsonl record."""
        start = time.perf_counter()
        with self._global_model():
            scores, val_loss = self._validate()
        (val_time_s,) = self.comms.max_floats([time.perf_counter() - start])
        samples = self.steps * self.config.batch_size * self.env.world_size
        chip_size = self.train_data.chip_size
        meter = self.meter
        record: dict[str, Any] = {
            "epoch": epoch,
            "world_size": self.env.world_size,
            "nodes": self.env.nodes,
            "epoch_time_s": stats.epoch_time_s,
            # CPU seconds of the training steps, summed over ranks: unlike wall time, barely
            # moved by other work on a shared machine.
            "epoch_cpu_s": stats.epoch_cpu_s,
            "load_time_s": self.load_time_s,
            "val_time_s": val_time_s,
            "train_loss": stats.train_loss,
            "val_loss": val_loss,
            "val_miou": scores.miou,
            "val_accuracy": scores.accuracy,
            "per_class_iou": scores.per_class_iou,
            "samples_per_s": samples / stats.epoch_time_s,
            "pixels_per_s": samples * chip_size**2 / stats.epoch_time_s,
            "step_time_s": stats.epoch_time_s / self.steps,
            "data_time_s": stats.data_time_s,
            "steps": self.steps,
            "comm_bytes_per_step": float(meter.bytes_per_step()) if meter is not None else 0.0,
            "comm_time_s": float(meter.time_per_step_s()) if meter is not None else 0.0,
            "compression": self.compression,
            "block_momentum": self.config.block_momentum,
            "model": self.config.model,
            "batch_size": self.config.batch_size,
            "device": self.device_name,
            "threads_per_worker": self.threads,
            "host": self.host,
            "lr": self.last_lr,  # of the epoch's last step
            "time": utc_now(),
        }
        logger.info(
            "epoch %d/%d: train loss %.4f, val loss %.4f, val mIoU %.4f, accuracy %.4f; "
            "%.2f s (%d steps, %.3f s/step, data %.2f%%), %.0f samples/s",
            epoch,
            self.config.epochs,
            stats.train_loss,
            val_loss,
            scores.miou,
            scores.accuracy,
            stats.epoch_time_s,
            self.steps,
            record["step_time_s"],
            100 * stats.data_time_s / max(record["step_time_s"], 1e-12),
            record["samples_per_s"],
        )
        return record

    # -- outputs --------------------------------------------------------------------------------

    def _save(self, epoch: int, record: Mapping[str, Any], *, improved: bool) -> None:
        """metrics line, model.pt (when improved, or when none exists), then the checkpoint."""
        own: dict[str, Any] = {}
        if self.bmuf is not None:
            # Between block ends every BMUF learner has its own model and optimizer state. The
            # block-level state (W_global, Δ, the last block end's BatchNorm statistics) is the
            # same on every rank, computed from the same all-reduced values: saved once, below.
            own["model"] = to_cpu(self.module.state_dict())
            own["optimizer"] = to_cpu(self.optimizer.state_dict())
        elif self.meter is not None:
            own["comm"] = to_cpu(self.meter.state_dict())
        per_rank = self.comms.gather_to_main(own)
        if not self.env.is_main:
            return
        append_metrics(self.out, record)
        with self._global_model():
            model_path = self.out / MODEL_FILE
            if improved or not model_path.exists():
                save_model_file(model_path, self.module, self._model_meta(epoch, record))
            model_state = to_cpu(self.module.state_dict())
        save_checkpoint(
            self.out,
            {
                "epoch": epoch,
                "world_size": self.env.world_size,
                "config": self.config.to_json(),
                "model": model_state,
                "optimizer": to_cpu(self.optimizer.state_dict()),
                "scheduler": self.scheduler.state_dict(),
                "per_rank": per_rank,
                "store": self.store,
                "bmuf": None if self.bmuf is None else to_cpu(self.bmuf.state_dict()),
                "best_val_miou": self.best_val_miou,
                "best_epoch": self.best_epoch,
                "epochs_without_improvement": self.epochs_without_improvement,
                "stopped_early": self.stopped_early,
                "metrics": [jsonable(m) for m in self.metrics],
                # No RNG state: every draw is a function of (seed, epoch, rank), see data.py.
                "seed": self.config.seed,
            },
        )

    def _model_meta(self, epoch: int, record: Mapping[str, Any]) -> ModelMeta:
        summary = self.summary
        training = {
            "epoch": epoch,
            "epochs": self.config.epochs,
            "val_miou": record["val_miou"],
            "val_accuracy": record["val_accuracy"],
            "per_class_iou": record["per_class_iou"],
            "world_size": self.env.world_size,
            "batch_size": self.config.batch_size,
            "optimizer": self.config.optimizer,
            "peak_lr": self.peak_lr,
            "loss": self.config.loss,
            "seed": self.config.seed,
            "store": self.config.store_url,
            "train_chips": self.num_train,
            "time": utc_now(),
        }
        return ModelMeta(
            architecture=self.config.model,
            class_map=self.class_map,
            band_names=tuple(summary.bands),
            band_mean=tuple(float(v) for v in summary.band_mean),
            band_std=tuple(float(v) for v in summary.band_std),
            chip_size=int(summary.chip_size),
            resolution_m=float(summary.resolution_m or 0.0),
            training=jsonable(training),
        )
