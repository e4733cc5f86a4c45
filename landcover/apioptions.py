"""The keyword options of `landcover.api`'s calls, typed: one `TypedDict` per config.

`landcover.tile(..., **options: Unpack[TileOptions])` lets a type checker and an editor check
and complete each option of `tiling.tiler.config.TileConfig`, and so for `TrainConfig` and
`PredictConfig`. Each key is a field of its config that the call does not take by name, with
the field's type; the defaults and the checks stay in the config alone (a key left out takes
the config's default). tests/landcover/test_api.py keeps the keys and the fields equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from landcover.comm.spec import CompressionSpec
    from landcover.prediction.choices import Backend, Precision, TtaMode
    from landcover.training.config import ClassWeights, Device, Loss, LrScaling, Optimizer

__all__ = ["PredictOptions", "TileOptions", "TrainOptions"]


class TileOptions(TypedDict, total=False):
    """`tiling.tiler.config.TileConfig` fields but images, out and labels."""

    chip_size: int
    stride: int | None
    shard_size: int
    min_valid: float
    class_map: str
    num_classes: int | None
    val_fraction: float
    split_block_chips: int
    workers: int | None
    storage_options: Mapping[str, Any]
    overwrite: bool
    compression_level: int
    zero_is_nodata: bool


class TrainOptions(TypedDict, total=False):
    """`landcover.training.config.TrainConfig` fields but store_url and out_dir."""

    model: str
    pretrained: str | None
    epochs: int
    batch_size: int
    lr: float | None
    lr_scaling: LrScaling
    warmup_epochs: float
    weight_decay: float
    optimizer: Optimizer
    loss: Loss
    class_weights: ClassWeights
    augment: bool
    brightness_jitter: float
    seed: int
    patience: int | None
    resume: bool
    overwrite: bool
    device: Device
    amp: bool | None
    threads: int | None
    storage_options: Mapping[str, Any]
    compression: CompressionSpec | str  # the text of --compression, parsed by the config
    block_momentum: bool
    block_size: int
    block_momentum_value: float | None
    block_lr: float
    nesterov: bool
    reset_local_momentum: bool
    allow_incomplete: bool
    sync_bn: bool
    tracking: str
    log_every: int


class PredictOptions(TypedDict, total=False):
    """`landcover.prediction.config.PredictConfig` fields but model, images, out, region
    and tile_px (arguments of `landcover.predict` of their own)."""

    dst_crs: str | None
    resolution: float | None
    overlap_px: int | None
    window: str  # --window: chip, auto or an edge in px
    batch_size: int
    device: str
    backend: Backend
    precision: Precision
    calibration: str | None  # --calibration: a chip store for --precision int8
    tta: TtaMode
    adapt: str  # --adapt: METHOD[:STRENGTH] (landcover.prediction.adaptspec)
    probabilities: str | None
    overwrite: bool
    block_px: int
    storage_options: Mapping[str, Any]
    progress: bool | None
    max_pixels: int | None
    zero_is_nodata: bool
    pipeline: bool
