"""`TrainConfig`: every option of a training run, identical on every rank.

Torch-free, so the CLI and the cluster launchers can build and check a configuration without
paying for importing torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from landcover.errors import TrainingError

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
    reset_local_momentum: bool = True
    allow_incomplete: bool = False  # train on a store whose tiling was interrupted
    sync_bn: bool = False

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
            (
                not (self.block_momentum and self.sync_bn),
                "--sync-bn all-reduces BatchNorm statistics in every step, which "
                "--block-momentum's local steps avoid (BMUF averages them at block ends); "
                "use one of them",
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
        values = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        values["storage_options"] = {
            k: "<redacted>" if SECRET_OPTION.search(k) else _plain(v)
            for k, v in self.storage_options.items()
        }
        return values


def _plain(value: Any) -> Any:
    """A JSON value: mappings as dicts, non-finite floats as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
