"""A rank's shard of chips held in RAM, and the batches cut from it.

The shard is loaded once (`tiling.chipstore.store.load_shard_into_memory`) and kept as one uint8
tensor (on the GPU when it fits). A batch is gathered from it chip by chip, each chip under a random
flip/rot90 (the same for image and mask) and converted to float32 in the same strided copy,
then normalised in place by `landcover.data.normalise`, the function prediction calls too. No
DataLoader workers: producing a batch this way costs well under 1 % of a training step
(benchmarks/bench_train.py), and no process pool means no copies of the shard.

All randomness is a pure function of (seed, epoch, rank): the shuffle and the augmentation of
an epoch come from a generator seeded by `derive_seed(seed, epoch, rank)`, so a resumed run
needs no saved RNG state and repeats the same batches exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from landcover.data.augment import gather_chips, random_gains, random_ops
from landcover.data.normalise import check_band_stats, normalise
from landcover.errors import TrainingError


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part (SeedSequence mixes them; no collisions
    between e.g. (seed=1, epoch=2) and (seed=2, epoch=1) as with plain sums)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def steps_per_epoch(shard_lengths: Sequence[int], batch_size: int) -> int:
    """Steps every rank takes per epoch: DDP needs the same count on all ranks, so the
    shortest shard decides (shards differ by at most one chip)."""
    if batch_size < 1:
        raise TrainingError(f"batch size {batch_size} must be >= 1")
    if not shard_lengths:
        raise TrainingError("no shards: the world has no ranks")
    return min(shard_lengths) // batch_size


@dataclass(frozen=True, slots=True)
class Batch:
    images: torch.Tensor  # float (B, bands, C, C), normalised
    labels: torch.Tensor  # int64 (B, C, C), class codes, 0 = nodata


class ShardDataset:
    """One rank's chips as uint8 tensors: images (n, bands, C, C), labels (n, C, C)."""

    def __init__(
        self,
        images: npt.NDArray[np.uint8] | torch.Tensor,
        labels: npt.NDArray[np.uint8] | torch.Tensor,
        *,
        band_mean: Sequence[float],
        band_std: Sequence[float],
        device: torch.device | str = "cpu",
    ) -> None:
        self.images = _as_uint8_tensor(images, "images")
        self.labels = _as_uint8_tensor(labels, "labels")
        if self.images.ndim != 4 or self.labels.ndim != 3:
            raise TrainingError(
                f"shard arrays have shapes {tuple(self.images.shape)} and "
                f"{tuple(self.labels.shape)}; expected (n, bands, C, C) and (n, C, C)"
            )
        n, bands, height, width = self.images.shape
        if tuple(self.labels.shape) != (n, height, width) or height != width:
            raise TrainingError(
                f"shard images {tuple(self.images.shape)} and labels "
                f"{tuple(self.labels.shape)} do not describe the same square chips"
            )
        check_band_stats(
            band_mean, band_std, bands=bands, error=TrainingError, fix="re-tile the store"
        )
        self.device = torch.device(device)
        self.images = self.images.to(self.device)
        self.labels = self.labels.to(self.device)
        shape = (1, bands, 1, 1)
        self.mean = torch.tensor(band_mean, dtype=torch.float32, device=self.device).view(shape)
        self.std = torch.tensor(band_std, dtype=torch.float32, device=self.device).view(shape)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def chip_size(self) -> int:
        return int(self.images.shape[-1])

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 chips → what the model sees (`normalise` with this shard's band stats)."""
        return normalise(images, self.mean, self.std)

    def batch(
        self,
        indices: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        brightness_jitter: float = 0.0,
    ) -> Batch:
        """Chips `indices` as normalised float32 images and int64 labels, each chip under a
        random flip/rotation when a generator is given, and random band gains
        (`random_gains`) when `brightness_jitter` is too."""
        ops = random_ops(len(indices), generator) if generator is not None else None
        images, labels = gather_chips(self.images, self.labels, indices, ops)
        if generator is not None and brightness_jitter > 0:
            gains = random_gains(len(indices), images.shape[1], brightness_jitter, generator)
            images.mul_(gains.to(images.device))
        # In place on the fresh float batch; augmentation moves pixels and scales them, so
        # "0 in every band" still marks the pixels without data.
        return Batch(normalise(images, self.mean, self.std), labels)

    def epoch_batches(
        self,
        *,
        batch_size: int,
        steps: int,
        seed: int,
        epoch: int,
        rank: int,
        augment: bool = True,
        brightness_jitter: float = 0.0,
    ) -> EpochBatches:
        return EpochBatches(
            self, batch_size=batch_size, steps=steps, seed=seed, epoch=epoch, rank=rank,
            augment=augment, brightness_jitter=brightness_jitter,
        )  # fmt: skip

    def sequential_batches(self, batch_size: int) -> Iterator[Batch]:
        """Every chip once, in order, unaugmented (validation)."""
        for start in range(0, len(self), batch_size):
            stop = min(start + batch_size, len(self))
            yield self.batch(torch.arange(start, stop))


class EpochBatches:
    """The `steps` batches of one epoch: a seeded shuffle of the shard, then augmented slices.

    `data_time_s` accumulates the time spent producing batches (index, augment, normalise),
    so the trainer can report it against the step time. (On CUDA kernels run asynchronously:
    there it is the time to launch them, and the rest shows up in the step time.)
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int,
        steps: int,
        seed: int,
        epoch: int,
        rank: int,
        augment: bool,
        brightness_jitter: float = 0.0,
    ) -> None:
        if steps * batch_size > len(dataset):
            raise TrainingError(
                f"{steps} steps of {batch_size} chips need {steps * batch_size} chips but the "
                f"shard holds {len(dataset)}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.steps = steps
        self.generator = torch.Generator().manual_seed(derive_seed(seed, epoch, rank))
        self.augment = augment
        self.brightness_jitter = brightness_jitter
        self.data_time_s = 0.0

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Batch]:
        start = time.perf_counter()
        order = torch.randperm(len(self.dataset), generator=self.generator)
        self.data_time_s += time.perf_counter() - start
        for step in range(self.steps):
            start = time.perf_counter()
            indices = order[step * self.batch_size : (step + 1) * self.batch_size]
            batch = self.dataset.batch(
                indices,
                generator=self.generator if self.augment else None,
                brightness_jitter=self.brightness_jitter,
            )
            self.data_time_s += time.perf_counter() - start
            yield batch


def _as_uint8_tensor(array: npt.NDArray[np.uint8] | torch.Tensor, name: str) -> torch.Tensor:
    tensor = (
        array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    )
    if tensor.dtype != torch.uint8:
        raise TrainingError(f"shard {name} have dtype {tensor.dtype}; the chip store holds uint8")
    return tensor.contiguous()
