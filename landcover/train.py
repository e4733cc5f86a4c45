"""Synchronous data-parallel training on a chip store.

`python -m landcover.train STORE --out RUN_DIR [options]` is the worker entry point for every
launcher (torchrun, Azure ML, Kubeflow); `landcover train` runs it in-process or spawns N local
workers through torchrun. One `train(config)` call is one worker:

1. rank 0 checks the run dir (refuses old results unless `--resume`/`--overwrite`);
2. every rank checks that its shard fits in RAM, then loads its train and val shards ONCE
   (timed: `load_time_s`, never part of `epoch_time_s`);
3. epochs of `steps` synchronous steps (DDP with a comm hook, or BMUF), the same step count on
   every rank, then validation whose confusion matrices are summed over ranks;
4. rank 0 appends a `metrics.jsonl` line, writes `model.pt` when val mIoU improves (so
   `model.pt` is the best-by-val-mIoU model) and writes `checkpoints/last.pt` atomically.

Learning rate: the base `--lr` is multiplied by the world size (`--lr-scaling linear`, the
"linear scaling rule"; `sqrt` and `none` too; never with BMUF, whose learners step like a
single worker), warmed up linearly from ~0 over `--warmup-epochs`, then decayed along a cosine
to 1% of the peak at the last step.

Resume is exact: all randomness is a pure function of (seed, epoch, rank) (model init from the
seed, shuffle and augmentation from `derive_seed(seed, epoch, rank)`, torch's global RNG reseeded
every epoch), so a checkpoint needs no RNG state, and a resumed run ends with the same weights as
an uninterrupted one (bitwise on CPU with the same thread count).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil  # type: ignore[import-untyped]
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from landcover.data import Batch, ShardDataset, derive_seed, steps_per_epoch
from landcover.distributed import Collectives, DistEnv, process_group, read_dist_env
from landcover.errors import TrainingError
from landcover.modelfile import ModelMeta, save_model_file

logger = logging.getLogger(__name__)

Optimizer = Literal["adamw", "sgd"]
Loss = Literal["ce", "ce+dice"]
ClassWeights = Literal["auto", "none"]
Device = Literal["auto", "cpu", "cuda"]
LrScaling = Literal["linear", "sqrt", "none"]

OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd")
LOSSES: tuple[str, ...] = ("ce", "ce+dice")
CLASS_WEIGHT_MODES: tuple[str, ...] = ("auto", "none")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
LR_SCALINGS: tuple[str, ...] = ("linear", "sqrt", "none")
DEFAULT_LR: Mapping[str, float] = {"adamw": 2e-3, "sgd": 0.02}
MIN_LR_RATIO = 0.01
# Fraction of the available RAM a node's shards may take: the model, optimizer, batch tensors,
# allocator slack and the page cache all need the rest.
MEMORY_SAFETY = 0.7
MAX_CLASS_WEIGHT = 10.0
CHECKPOINT_FORMAT = "landcover-checkpoint"
CHECKPOINT_VERSION = 1
METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
MODEL_FILE = "model.pt"
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.pt"
RESULT_NAMES = (METRICS_FILE, RUN_FILE, MODEL_FILE, CHECKPOINT_DIR)
# Storage options that must not end up in run.json or checkpoints (adlfs/s3fs/gcsfs names).
SECRET_OPTION = re.compile(r"key|secret|token|password|credential|sas|connection", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs; built by the CLI, identical on every rank."""

    store_url: str
    out_dir: str
    model: str = "small_unet"
    pretrained: str | None = None
    epochs: int = 10
    batch_size: int = 16
    lr: float | None = None  # None: DEFAULT_LR of the optimizer
    lr_scaling: LrScaling = "linear"
    warmup_epochs: float = 1.0
    weight_decay: float = 1e-4
    optimizer: Optimizer = "adamw"
    loss: Loss = "ce"
    class_weights: ClassWeights = "auto"
    augment: bool = True
    seed: int = 0
    patience: int | None = None
    resume: bool = False
    overwrite: bool = False
    device: Device = "auto"
    amp: bool | None = None  # None: bf16 autocast on CUDA, off on CPU
    threads: int | None = None  # None: cores / local world size
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    compression: str = "none"
    block_momentum: bool = False
    block_size: int = 8
    block_momentum_value: float | None = None
    block_lr: float = 1.0
    nesterov: bool = True

    def __post_init__(self) -> None:
        choices = {
            "optimizer": OPTIMIZERS,
            "loss": LOSSES,
            "class_weights": CLASS_WEIGHT_MODES,
            "device": DEVICES,
            "lr_scaling": LR_SCALINGS,
        }
        checks: list[tuple[bool, str]] = [
            (self.epochs >= 1, f"--epochs {self.epochs} must be >= 1"),
            (self.batch_size >= 1, f"--batch-size {self.batch_size} must be >= 1"),
            (self.lr is None or self.lr > 0, f"--lr {self.lr} must be > 0"),
            (self.warmup_epochs >= 0, f"--warmup-epochs {self.warmup_epochs} must be >= 0"),
            (self.weight_decay >= 0, f"--weight-decay {self.weight_decay} must be >= 0"),
            (
                self.patience is None or self.patience >= 1,
                f"--patience {self.patience} must be >= 1",
            ),
            (self.threads is None or self.threads >= 1, f"--threads {self.threads} must be >= 1"),
            (self.block_size >= 1, f"--block-size {self.block_size} must be >= 1"),
            (self.block_lr > 0, f"--block-lr {self.block_lr} must be > 0"),
            (
                self.block_momentum_value is None or 0 <= self.block_momentum_value < 1,
                f"--block-momentum-value {self.block_momentum_value} must be in [0, 1)",
            ),
            *(
                (
                    getattr(self, name) in allowed,
                    f"--{name.replace('_', '-')} {getattr(self, name)!r}: use one of {allowed}",
                )
                for name, allowed in choices.items()
            ),
            (
                not (self.resume and self.overwrite),
                "--resume and --overwrite exclude each other; pick one",
            ),
            (
                not (self.block_momentum and self.compression != "none"),
                f"--compression {self.compression} compresses DDP gradients but --block-momentum "
                "averages models instead; use one of them",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainingError(message)
        from landcover.comm import parse_compression

        parse_compression(self.compression)  # a bad value fails here, not after the load

    @property
    def base_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def to_json(self) -> dict[str, Any]:
        """Plain values for run.json and checkpoints; secrets in storage options redacted."""
        values = {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}
        values["storage_options"] = {
            k: "<redacted>" if SECRET_OPTION.search(k) else _jsonable(v)
            for k, v in self.storage_options.items()
        }
        return values


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
    with process_group(env, device) as collectives:
        trainer = Trainer(config, env, collectives, device, threads, callbacks or TrainCallbacks())
        return trainer.run()


# -- run directory ------------------------------------------------------------------------------


def check_run_dir(out_dir: str | os.PathLike[str], *, resume: bool, overwrite: bool) -> None:
    """Refuse a run dir that already holds results unless told to resume or overwrite."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: exists and is not a directory; choose another --out")
    found = [name for name in RESULT_NAMES if (out / name).exists()]
    if found and not (resume or overwrite):
        raise TrainingError(
            f"{out}: already holds a training run ({', '.join(found)}); pass --resume to "
            "continue it or --overwrite to replace it"
        )


def _reset_run_dir(out: Path) -> None:
    for name in RESULT_NAMES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _write_atomic(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temp file in the same directory, then rename: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_json_atomic(path: Path, obj: Any) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text(json.dumps(obj, indent=2) + "\n")

    _write_atomic(path, write)


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- machine ------------------------------------------------------------------------------------


def available_memory_bytes() -> int:
    return int(psutil.virtual_memory().available)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def configure_threads(threads: int | None, local_world_size: int) -> int:
    """Give each local worker its share of the cores: 2 workers on 2 cores get 1 thread each,
    which is what makes a 1-vs-2-worker epoch time a fair scaling measurement."""
    count = threads or max(1, usable_cores() // local_world_size)
    torch.set_num_threads(count)
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError:  # only settable once, before any inter-op work in this process
        logger.debug("inter-op threads already fixed at %d", torch.get_num_interop_threads())
    return count


def resolve_device(name: str, env: DistEnv) -> torch.device:
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainingError("--device cuda but no CUDA device is visible; use --device cpu")
    count = torch.cuda.device_count()
    if env.local_world_size > count:
        raise TrainingError(
            f"{env.local_world_size} workers on this node but only {count} GPUs; start at most "
            f"{count} workers per node or use --device cpu"
        )
    return torch.device("cuda", env.local_rank)


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model_name()}"


def check_shard_fits(
    shard_bytes_for: Callable[[int], int],
    *,
    world_size: int,
    local_world_size: int,
    available_bytes: int,
) -> int:
    """Bytes this rank's shard needs; TrainingError naming the worker count that would fit.

    `shard_bytes_for(w)` is the per-rank shard size with w workers. Adding workers on the same
    node does not help (they share its RAM), so the advice is a total count over more nodes.
    """
    need = shard_bytes_for(world_size)
    budget = available_bytes * MEMORY_SAFETY / local_world_size
    if need <= budget:
        return need
    workers = max(world_size + 1, math.ceil(shard_bytes_for(1) / max(budget, 1.0)))
    while shard_bytes_for(workers) > budget and workers < 1 << 20:
        workers += max(1, workers // 16)
    gib = 1024**3
    raise TrainingError(
        f"each worker's shard needs {need / gib:.2f} GiB with {world_size} workers but only "
        f"{budget / gib:.2f} GiB is free per worker ({available_bytes / gib:.2f} GiB available "
        f"x {MEMORY_SAFETY} / {local_world_size} workers on this node); use at least "
        f"{workers} workers in total (spread over more nodes) or machines with more memory"
    )


# -- loss and metrics ---------------------------------------------------------------------------


def class_weights_from_counts(counts: Sequence[int], num_classes: int) -> list[float]:
    """Median-frequency balancing: w_c = median(f) / f_c over the classes present, clipped to
    [1/MAX, MAX] so a class with a handful of pixels cannot dominate; nodata and absent
    classes get 0 (they are never a target)."""
    padded = np.zeros(num_classes, dtype=np.float64)
    values = np.asarray(counts, dtype=np.float64)[:num_classes]
    padded[: len(values)] = values
    padded[0] = 0.0
    present = padded > 0
    weights = np.zeros(num_classes, dtype=np.float64)
    if present.any():
        freq = padded[present] / padded[present].sum()
        weights[present] = np.clip(np.median(freq) / freq, 1 / MAX_CLASS_WEIGHT, MAX_CLASS_WEIGHT)
    return [float(w) for w in weights]


def segmentation_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    class_weights: torch.Tensor | None,
    dice: bool,
) -> torch.Tensor:
    """Cross-entropy over labelled pixels (code 0 = nodata is ignored), optionally + soft Dice.

    Computed as a sum over a clamped weight total instead of `reduction="mean"`, so a batch
    of nodata only gives 0 (not NaN) without a host sync to check for it.
    """
    num_classes = logits.shape[1]
    weights = (
        class_weights
        if class_weights is not None
        else torch.ones(num_classes, device=logits.device).index_fill_(0, _zero(logits), 0.0)
    )
    total = F.cross_entropy(logits, labels, weight=weights, ignore_index=0, reduction="sum")
    loss = total / weights[labels].sum().clamp_min(1e-6)
    if dice:
        loss = loss + dice_loss(logits, labels)
    return loss


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int64, device=like.device)


def dice_loss(logits: torch.Tensor, labels: torch.Tensor, *, smooth: float = 1.0) -> torch.Tensor:
    """1 - mean soft Dice over the classes (not nodata) present in the batch's labels."""
    num_classes = logits.shape[1]
    valid = (labels != 0).unsqueeze(1).to(logits.dtype)
    probs = logits.softmax(dim=1) * valid
    target = F.one_hot(labels, num_classes).permute(0, 3, 1, 2).to(logits.dtype) * valid
    dims = (0, 2, 3)
    intersection = (probs * target).sum(dims)[1:]
    cardinality = (probs.sum(dims) + target.sum(dims))[1:]
    present = (target.sum(dims)[1:] > 0).to(logits.dtype)
    dice = (2 * intersection + smooth) / (cardinality + smooth)
    return ((1 - dice) * present).sum() / present.sum().clamp_min(1.0)


def confusion_counts(pred: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Flattened (truth, prediction) counts over labelled pixels, int64 of length K*K."""
    valid = labels != 0
    index = labels[valid] * num_classes + pred[valid]
    return torch.bincount(index, minlength=num_classes * num_classes)


@dataclass(frozen=True, slots=True)
class Scores:
    miou: float
    accuracy: float
    per_class_iou: list[float | None]  # index = class code; nodata and absent classes None


def scores_from_confusion(confusion: np.ndarray[Any, Any]) -> Scores:
    """mIoU over the classes (not nodata) that occur in truth or prediction; pixel accuracy."""
    cm = confusion.astype(np.float64)
    tp = np.diag(cm)
    union = cm.sum(axis=0) + cm.sum(axis=1) - tp
    per_class: list[float | None] = [None]
    for code in range(1, cm.shape[0]):
        per_class.append(float(tp[code] / union[code]) if union[code] > 0 else None)
    present = [v for v in per_class if v is not None]
    miou = float(np.mean(present)) if present else float("nan")
    total = cm.sum()
    accuracy = float(tp.sum() / total) if total > 0 else float("nan")
    return Scores(miou=miou, accuracy=accuracy, per_class_iou=per_class)


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """LR multiplier after `step` optimizer steps: linear warm-up, then cosine to MIN_LR_RATIO."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_scale(scaling: str, world_size: int) -> float:
    return {"linear": float(world_size), "sqrt": math.sqrt(world_size), "none": 1.0}[scaling]


# -- the trainer --------------------------------------------------------------------------------


@dataclass(slots=True)
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
        self.start_epoch = 0
        self.stopped_early = False
        self.resumed_from: int | None = None

    # -- setup ----------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        checkpoint_path = self._prepare_run_dir()
        self._open_store()
        self._build_model()  # before the long load: a bad --model or --pretrained fails fast
        self._load_shards()
        common, own = self._read_checkpoint(checkpoint_path)
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
                check_run_dir(self.out, resume=self.config.resume, overwrite=self.config.overwrite)
                last = self.out / CHECKPOINT_DIR / LAST_CHECKPOINT
                if self.config.resume and last.exists():
                    checkpoint = last
                else:
                    if self.config.resume:
                        logger.info("%s: no checkpoint to resume from; starting fresh", self.out)
                    _reset_run_dir(self.out)
                self.out.mkdir(parents=True, exist_ok=True)
            except (TrainingError, OSError) as exc:
                error = str(exc)
        self.comms.raise_if_any(error)
        return self.comms.broadcast_object(checkpoint)

    def _open_store(self) -> None:
        from tiling.store import assign_chips_to_ranks, open_store

        store = open_store(self.config.store_url, storage_options=self.config.storage_options)
        summary = store.summary
        if not summary.has_labels or summary.class_map is None:
            raise TrainingError(
                f"{self.config.store_url}: the store has no labels; tile with --labels to train"
            )
        world = self.env.world_size
        train_ids = store.chip_ids("train")
        val_ids = store.chip_ids("val")
        if len(val_ids) == 0:
            raise TrainingError(
                f"{self.config.store_url}: the store has no val chips; tile with a val fraction > 0"
            )
        lengths = [len(ids) for ids in assign_chips_to_ranks(train_ids, world)]
        self.steps = steps_per_epoch(lengths, self.config.batch_size)
        if self.steps < 1:
            raise TrainingError(
                f"{len(train_ids)} train chips over {world} workers give {min(lengths)} chips per "
                f"worker, fewer than --batch-size {self.config.batch_size}; use a smaller batch "
                "or fewer workers"
            )
        self.store = store
        self.summary = summary
        self.class_map = summary.class_map
        self.num_classes = int(summary.class_map.num_classes)
        self.num_train = len(train_ids)
        self.num_val = len(val_ids)

    def _load_shards(self) -> None:
        from tiling.store import load_shard_into_memory, shard_bytes

        def need(workers: int) -> int:
            return sum(
                int(shard_bytes(self.summary, world_size=workers, split=split))
                for split in ("train", "val")
            )

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

        loaded = {
            split: load_shard_into_memory(
                self.config.store_url,
                rank=self.env.rank,
                world_size=self.env.world_size,
                split=split,
                storage_options=self.config.storage_options,
            )
            for split in ("train", "val")
        }
        load_time_s = sum(float(shard.load_time_s) for shard in loaded.values())
        bytes_read = sum(int(shard.bytes_read) for shard in loaded.values())
        self.load_time_s, self.load_bytes = self.comms.max_floats([load_time_s, bytes_read])
        # A shard on the GPU makes a batch one index_select; keep it on the host if it would
        # crowd out activations.
        storage = self.device
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            total = sum(s.nbytes for s in loaded.values())
            storage = self.device if total < 0.25 * free else torch.device("cpu")
        mean, std = list(self.summary.band_mean), list(self.summary.band_std)
        datasets = []
        for split in ("train", "val"):
            shard = loaded[split]
            if shard.labels is None:
                raise TrainingError(f"{self.config.store_url}: the store has no labels to train")
            datasets.append(
                ShardDataset(
                    shard.images, shard.labels, band_mean=mean, band_std=std, device=storage
                )
            )
        self.train_data, self.val_data = datasets
        self.chip_size = self.train_data.chip_size
        logger.info(
            "rank %d: loaded %d train + %d val chips (%.1f MiB) in %.2f s",
            self.env.rank,
            len(self.train_data),
            len(self.val_data),
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
        from landcover.models import build_model

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
                payload = _load_checkpoint(path, self.config)
                per_rank = payload.pop("per_rank")
                if len(per_rank) != self.env.world_size:
                    logger.warning(
                        "%s was written by %d workers, now %d: per-worker state (comm "
                        "residuals, BMUF local models) starts fresh",
                        path,
                        len(per_rank),
                        self.env.world_size,
                    )
                    per_rank = [{} for _ in range(self.env.world_size)]
            except TrainingError as exc:
                error = str(exc)
        self.comms.raise_if_any(error)
        common = self.comms.broadcast_object(payload)
        own = self.comms.scatter_from_main(per_rank)
        assert common is not None
        try:
            self.module.load_state_dict(own.get("model", common["model"]))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise TrainingError(
                f"{path}: checkpoint does not fit {self.config.model} ({first}); "
                "pass --overwrite to start over"
            ) from None
        self.start_epoch = int(common["epoch"])
        self.resumed_from = self.start_epoch
        self.best_val_miou = float(common["best_val_miou"])
        self.best_epoch = int(common["best_epoch"])
        self.epochs_without_improvement = int(common["epochs_without_improvement"])
        self.stopped_early = bool(common.get("stopped_early", False))
        self.metrics = [dict(m) for m in common["metrics"]]
        if self.env.is_main:
            # Lines after the checkpoint's epoch belong to the interrupted attempt.
            lines = "".join(json.dumps(m) + "\n" for m in self.metrics)

            def write(tmp: str) -> None:
                Path(tmp).write_text(lines)

            _write_atomic(self.out / METRICS_FILE, write)
        logger.info("resuming %s after epoch %d", self.out, self.start_epoch)
        return common, own

    def _build_parallel_model(
        self, common: Mapping[str, Any] | None, own: Mapping[str, Any]
    ) -> None:
        from landcover.comm import BlockMomentum, install_comm_hook, parse_compression

        config = self.config
        spec = parse_compression(config.compression)
        self.compression = str(spec)  # normalised: "powersgd" -> "powersgd:2"
        self.bmuf: Any = None
        self.meter: Any = None
        self.model: nn.Module = self.module
        if not self.env.is_distributed:
            if config.compression != "none" or config.block_momentum:
                logger.warning("one worker: --compression/--block-momentum have nothing to do")
            return
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
            if own.get("comm") is not None:
                self.bmuf.load_state_dict(own["comm"])
            return
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        self.meter = install_comm_hook(self.model, spec)
        if own.get("comm") is not None:
            self.meter.load_state_dict(own["comm"])

    def _build_optimizer(self, common: Mapping[str, Any] | None, own: Mapping[str, Any]) -> None:
        config = self.config
        scale = 1.0 if config.block_momentum else lr_scale(config.lr_scaling, self.env.world_size)
        self.peak_lr = config.base_lr * scale
        params = self.module.parameters()
        if config.optimizer == "adamw":
            self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(
                params, lr=self.peak_lr, weight_decay=config.weight_decay
            )
        else:
            self.optimizer = torch.optim.SGD(
                params,
                lr=self.peak_lr,
                momentum=0.9,
                nesterov=True,
                weight_decay=config.weight_decay,
            )
        self.total_steps = config.epochs * self.steps
        self.warmup_steps = min(round(config.warmup_epochs * self.steps), self.total_steps // 2)
        warmup, total = self.warmup_steps, self.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: warmup_cosine(step, warmup_steps=warmup, total_steps=total),
        )
        if common is not None:
            self.optimizer.load_state_dict(own.get("optimizer", common["optimizer"]))
            self.scheduler.load_state_dict(common["scheduler"])

    def _write_run_json(self) -> None:
        import torchvision

        import landcover

        info = {
            "config": self.config.to_json(),
            "versions": {
                "landcover": landcover.__version__,
                "torch": torch.__version__,
                "torchvision": torchvision.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
            },
            "device": self.device_name,
            "host": self.host,
            "threads_per_worker": self.threads,
            "interop_threads": torch.get_num_interop_threads(),
            "world_size": self.env.world_size,
            "nodes": self.env.nodes,
            "local_world_size": self.env.local_world_size,
            "amp": self.amp,
            "store": {"url": self.config.store_url, "summary": _jsonable(self.summary)},
            "train_chips": self.num_train,
            "val_chips": self.num_val,
            "steps_per_epoch": self.steps,
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "load_time_s": self.load_time_s,
            "load_bytes": int(self.load_bytes),
            "resumed_from_epoch": self.resumed_from,
            "started": _now(),
        }
        _write_json_atomic(self.out / RUN_FILE, info)

    # -- the loop -------------------------------------------------------------------------------

    def _fit(self) -> TrainResult:
        config = self.config
        stopped_early = self.stopped_early
        if stopped_early:
            logger.info(
                "%s stopped early after epoch %d; nothing to resume", self.out, self.start_epoch
            )
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
        first = config.epochs + 1 if stopped_early else self.start_epoch + 1
        for epoch in range(first, config.epochs + 1):
            stats = self._train_epoch(epoch)
            record = self._validate_and_record(epoch, stats)
            improved = record["val_miou"] > self.best_val_miou  # NaN never improves
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
            self.stopped_early = stopped_early = bool(self.comms.broadcast_object(stop))
            self._save(epoch, record, improved=improved)
            if self.callbacks.on_epoch_end is not None:
                self.callbacks.on_epoch_end(epoch, record)
            if stopped_early:
                logger.info(
                    "early stop after epoch %d: no val mIoU gain for %d epochs",
                    epoch,
                    self.epochs_without_improvement,
                )
                break
        return TrainResult(
            run_dir=self.out,
            epochs_completed=len(self.metrics),
            best_epoch=self.best_epoch,
            best_val_miou=self.best_val_miou,
            stopped_early=stopped_early,
            metrics=tuple(self.metrics),
        )

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
            if self.bmuf is not None:
                self.bmuf.after_optimizer_step()
            loss_sum += loss.detach()
            if self.callbacks.on_step is not None:
                self.callbacks.on_step(epoch, step, self.module)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        epoch_time_s = time.perf_counter() - start
        epoch_cpu_s = time.process_time() - start_cpu
        # DDP broadcasts rank 0's BatchNorm buffers before each forward, and each rank then
        # updates them with its own batch; align them so validation and the checkpoint see one
        # model. (BMUF keeps its own per-rank models: that is the algorithm.)
        if self.bmuf is None:
            self.comms.broadcast_module(self.module, buffers_only=True)
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

    def _progress(self, batches: Iterator[Batch] | Any, epoch: int) -> Iterator[Batch]:
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
        unweighted cross-entropy per labelled pixel, comparable across --loss/--class-weights."""
        self.module.eval()
        k = self.num_classes
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

    def _validate_and_record(self, epoch: int, stats: _EpochStats) -> dict[str, Any]:
        start = time.perf_counter()
        scores, val_loss = self._validate()
        (val_time_s,) = self.comms.max_floats([time.perf_counter() - start])
        samples = self.steps * self.config.batch_size * self.env.world_size
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
            "pixels_per_s": samples * self.chip_size**2 / stats.epoch_time_s,
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
            "time": _now(),
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
        if self.meter is not None:
            state_holder = self.bmuf if self.bmuf is not None else self.meter
            own["comm"] = _to_cpu(state_holder.state_dict())
        if self.bmuf is not None:
            # Between block syncs every BMUF learner has its own model and optimizer state.
            own["model"] = _to_cpu(self.module.state_dict())
            own["optimizer"] = _to_cpu(self.optimizer.state_dict())
        per_rank = self.comms.gather_to_main(own)
        if not self.env.is_main:
            return
        with (self.out / METRICS_FILE).open("a") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")
        model_path = self.out / MODEL_FILE
        if improved or not model_path.exists():
            save_model_file(model_path, self.module, self._model_meta(epoch, record))
        payload = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "epoch": epoch,
            "world_size": self.env.world_size,
            "config": self.config.to_json(),
            "model": _to_cpu(self.module.state_dict()),
            "optimizer": _to_cpu(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "per_rank": per_rank,
            "best_val_miou": self.best_val_miou,
            "best_epoch": self.best_epoch,
            "epochs_without_improvement": self.epochs_without_improvement,
            "stopped_early": self.stopped_early,
            "metrics": [_jsonable(m) for m in self.metrics],
            # No RNG state: every draw is a function of (seed, epoch, rank), see data.py.
            "seed": self.config.seed,
        }
        path = self.out / CHECKPOINT_DIR / LAST_CHECKPOINT
        _write_atomic(path, lambda tmp: torch.save(payload, tmp))

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
            "time": _now(),
        }
        return ModelMeta(
            architecture=self.config.model,
            class_map=self.class_map,
            band_names=tuple(summary.bands),
            band_mean=tuple(float(v) for v in summary.band_mean),
            band_std=tuple(float(v) for v in summary.band_std),
            chip_size=int(summary.chip_size),
            resolution_m=float(summary.resolution_m or 0.0),
            training=_jsonable(training),
        )


def _load_checkpoint(path: Path, config: TrainConfig) -> dict[str, Any]:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise TrainingError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}); delete it or pass --overwrite"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise TrainingError(f"{path}: not a landcover checkpoint; pass --overwrite to start over")
    if int(payload.get("version", 0)) > CHECKPOINT_VERSION:
        raise TrainingError(f"{path}: checkpoint from a newer landcover; upgrade landcover")
    saved = payload["config"]
    for key in ("model", "batch_size", "optimizer"):
        if saved.get(key) != getattr(config, key):
            raise TrainingError(
                f"{path}: checkpoint was trained with --{key.replace('_', '-')} "
                f"{saved.get(key)}, not {getattr(config, key)}; pass the same value or --overwrite"
            )
    return dict(payload)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, Mapping):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _jsonable(obj: Any) -> Any:
    """Plain JSON values from configs, store summaries, numpy scalars; NaN becomes null."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "to_json"):
        return _jsonable(obj.to_json())
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in fields(obj) if f.init}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray | torch.Tensor):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, list | tuple | set | frozenset):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m landcover.train`: the worker entry point (options as `landcover train`)."""
    from landcover.commands.train import WORKER_PROG, worker_command

    worker_command.main(args=list(argv) if argv is not None else None, prog_name=WORKER_PROG)


if __name__ == "__main__":
    main()
