"""Training data in RAM: a worker's shard as tensors, its epoch batches with augmentation, and
`normalise`, the one normalisation training and prediction share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.data.shards import (
        Batch,
        ShardDataset,
        check_band_stats,
        derive_seed,
        normalise,
    )

__all__ = ["Batch", "ShardDataset", "check_band_stats", "derive_seed", "normalise"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Batch": "shards",
        "ShardDataset": "shards",
        "check_band_stats": "shards",
        "derive_seed": "shards",
        "normalise": "shards",
    },
)
