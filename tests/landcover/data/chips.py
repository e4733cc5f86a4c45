"""A small in-RAM shard for the data tests: random uint8 chips whose labels are a function
of the image, so a transform applied to both keeps them in register."""

from __future__ import annotations

import numpy as np

from landcover.data import ShardDataset

MEAN = (100.0, 90.0, 80.0, 120.0)
STD = (40.0, 30.0, 20.0, 50.0)


def make_dataset(n: int = 23, chip: int = 12, seed: int = 0) -> ShardDataset:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 4, chip, chip), dtype=np.uint8)
    # Labels that are a function of the image, so a joint transform keeps them in register.
    labels = (images[:, 0] % 5).astype(np.uint8)
    return ShardDataset(images, labels, band_mean=MEAN, band_std=STD)
