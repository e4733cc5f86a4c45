"""Training data in RAM: a worker's shard as tensors and its epoch batches (`shards`), the
augmentation applied while a batch is gathered (`augment`), and `normalise`, the one
normalisation training and prediction share (`normalise`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.data.augment import (
        dihedral,
        gather_chips,
        inverse_dihedral,
        random_gains,
        random_ops,
    )
    from landcover.data.normalise import check_band_stats, normalise
    from landcover.data.shards import Batch, ShardDataset, derive_seed

__all__ = [
    "Batch",
    "ShardDataset",
    "check_band_stats",
    "derive_seed",
    "dihedral",
    "gather_chips",
    "inverse_dihedral",
    "normalise",
    "random_gains",
    "random_ops",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Batch": "shards",
        "ShardDataset": "shards",
        "derive_seed": "shards",
        "dihedral": "augment",
        "gather_chips": "augment",
        "inverse_dihedral": "augment",
        "random_gains": "augment",
        "random_ops": "augment",
        "check_band_stats": "normalise",
        "normalise": "normalise",
    },
)
