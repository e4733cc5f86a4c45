"""Training: one `TrainConfig` for every option; `train` builds a worker's objects
(`builders`, `sync`, `resume`) and runs the `Trainer` over them; the learning-rate schedule,
losses and scores, the run directory and its typed records, and the distributed environment.
`python -m landcover.training` is the worker entry point every launcher runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.training.config import TrainConfig
    from landcover.training.distributed import Collectives, cpu_model_name
    from landcover.training.losses import (
        Scores,
        class_weights_from_counts,
        confusion_counts,
        scores_from_confusion,
        segmentation_loss,
    )
    from landcover.training.preflight import check_local_training, open_training_store
    from landcover.training.records import (
        Checkpoint,
        EpochRecord,
        RunInfo,
        steady_epoch_time_s,
        steady_samples_per_s,
    )
    from landcover.training.rundir import read_metrics
    from landcover.training.schedule import LrSchedule, build_optimizer, lr_scale, warmup_cosine
    from landcover.training.sync import BmufSync, DdpSync, SyncStrategy
    from landcover.training.trainer import TrainCallbacks, Trainer, TrainResult
    from landcover.training.worker import build_trainer, train

__all__ = [
    "BmufSync",
    "Checkpoint",
    "Collectives",
    "DdpSync",
    "EpochRecord",
    "LrSchedule",
    "RunInfo",
    "Scores",
    "SyncStrategy",
    "TrainCallbacks",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "build_trainer",
    "check_local_training",
    "class_weights_from_counts",
    "confusion_counts",
    "cpu_model_name",
    "lr_scale",
    "open_training_store",
    "read_metrics",
    "scores_from_confusion",
    "segmentation_loss",
    "steady_epoch_time_s",
    "steady_samples_per_s",
    "train",
    "warmup_cosine",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TrainConfig": "config",
        "TrainCallbacks": "trainer",
        "TrainResult": "trainer",
        "Trainer": "trainer",
        "train": "worker",
        "build_trainer": "worker",
        "BmufSync": "sync",
        "DdpSync": "sync",
        "SyncStrategy": "sync",
        "Checkpoint": "records",
        "EpochRecord": "records",
        "RunInfo": "records",
        "steady_epoch_time_s": "records",
        "steady_samples_per_s": "records",
        "LrSchedule": "schedule",
        "build_optimizer": "schedule",
        "lr_scale": "schedule",
        "warmup_cosine": "schedule",
        "Scores": "losses",
        "class_weights_from_counts": "losses",
        "confusion_counts": "losses",
        "scores_from_confusion": "losses",
        "segmentation_loss": "losses",
        "Collectives": "distributed",
        "cpu_model_name": "distributed",
        "read_metrics": "rundir",
        "check_local_training": "preflight",
        "open_training_store": "preflight",
    },
)
