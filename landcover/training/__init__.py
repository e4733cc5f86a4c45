"""Training: one `TrainConfig` for every option, the worker's `Trainer`, the learning-rate
schedule, losses and scores, the run directory, resume and the distributed environment. `python
-m landcover.training` is the worker entry point every launcher runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.training.config import TrainConfig
    from landcover.training.distributed import (
        Collectives,
        DistEnv,
        cpu_model_name,
        read_dist_env,
        usable_cores,
    )
    from landcover.training.losses import (
        Scores,
        class_weights_from_counts,
        confusion_counts,
        scores_from_confusion,
        segmentation_loss,
    )
    from landcover.training.preflight import check_local_training, open_training_store
    from landcover.training.rundir import read_metrics
    from landcover.training.schedule import LrSchedule, build_optimizer, lr_scale, warmup_cosine
    from landcover.training.trainer import TrainCallbacks, Trainer, TrainResult, train

__all__ = [
    "Collectives",
    "DistEnv",
    "LrSchedule",
    "Scores",
    "TrainCallbacks",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "check_local_training",
    "class_weights_from_counts",
    "confusion_counts",
    "cpu_model_name",
    "lr_scale",
    "open_training_store",
    "read_dist_env",
    "read_metrics",
    "scores_from_confusion",
    "segmentation_loss",
    "train",
    "usable_cores",
    "warmup_cosine",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TrainConfig": "config",
        "TrainCallbacks": "trainer",
        "TrainResult": "trainer",
        "Trainer": "trainer",
        "train": "trainer",
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
        "DistEnv": "distributed",
        "cpu_model_name": "distributed",
        "read_dist_env": "distributed",
        "usable_cores": "distributed",
        "read_metrics": "rundir",
        "check_local_training": "preflight",
        "open_training_store": "preflight",
    },
)
