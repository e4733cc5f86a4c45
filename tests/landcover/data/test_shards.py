"""The in-RAM shard dataset: batches, epochs, determinism, bad shards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from landcover.data.shards import ShardDataset, derive_seed, steps_per_epoch
from landcover.errors import TrainingError
from tests.landcover.data.chips import MEAN, STD, make_dataset
from tiling.chipstore.store import load_shard_into_memory, open_store


def test_derive_seed_is_pure_and_mixes_every_part() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    seeds = {derive_seed(s, e, r) for s in range(3) for e in range(3) for r in range(3)}
    assert len(seeds) == 27
    assert derive_seed(1, 2, 0) != derive_seed(2, 1, 0)
    assert 0 <= derive_seed(7, 7, 7) < 2**63


def test_steps_per_epoch_is_set_by_the_shortest_shard() -> None:
    assert steps_per_epoch([37, 36, 37], 8) == 4
    assert steps_per_epoch([7, 8], 8) == 0
    with pytest.raises(TrainingError, match="batch size 0 must be >= 1"):
        steps_per_epoch([10], 0)


def test_augmented_batches_are_normalised_like_plain_ones() -> None:
    ds = make_dataset()
    indices = torch.arange(6)
    augmented = ds.batch(indices, generator=torch.Generator().manual_seed(1))
    plain = ds.batch(indices)
    # A symmetry permutes pixels: per-chip sorted values match exactly.
    for a, b in zip(augmented.images, plain.images, strict=True):
        assert torch.equal(a.flatten().sort().values, b.flatten().sort().values)


def test_brightness_jitter_scales_bands_within_bounds_and_keeps_nodata() -> None:
    ds = make_dataset()
    ds.images[0, :, :3, :3] = 0  # pixels without data in every band
    indices = torch.arange(6)
    seed = 3
    plain = ds.batch(indices, generator=torch.Generator().manual_seed(seed))
    jittered = ds.batch(
        indices, generator=torch.Generator().manual_seed(seed), brightness_jitter=0.3
    )
    assert torch.equal(plain.labels, jittered.labels)  # same symmetries drawn first
    mean, std = torch.tensor(MEAN).view(1, 4, 1, 1), torch.tensor(STD).view(1, 4, 1, 1)
    raw_plain, raw_jittered = plain.images * std + mean, jittered.images * std + mean
    has_data = (plain.images != 0).any(dim=1, keepdim=True)
    bright = (raw_plain > 20) & has_data  # well clear of float error in the ratio
    gains = (raw_jittered / raw_plain).flatten(2)
    per_band = gains.where(bright.flatten(2), torch.nan).nanmedian(dim=2).values
    spread = (gains - per_band[..., None]).abs().where(bright.flatten(2), 0.0)
    assert float(spread.max()) < 1e-3  # one gain per chip and band
    # brightness in [0.7, 1.3] x colour in [0.85, 1.15], and not all alike
    assert (per_band > 0.7 * 0.85).all() and (per_band < 1.3 * 1.15).all()
    assert float(per_band.std()) > 0.01
    # Nodata stays nodata: normalised to exactly 0 in every band.
    nodata = (plain.images == 0).all(dim=1)
    assert int(nodata.sum()) >= 9
    assert torch.equal((jittered.images == 0).all(dim=1), nodata)


def test_epoch_batches_are_a_pure_function_of_seed_epoch_rank() -> None:
    ds = make_dataset()

    def run(seed: int, epoch: int, rank: int) -> list[torch.Tensor]:
        batches = ds.epoch_batches(batch_size=4, steps=5, seed=seed, epoch=epoch, rank=rank)
        return [b.images for b in batches]

    first = run(0, 1, 0)
    assert len(first) == 5 and all(b.shape == (4, 4, 12, 12) for b in first)
    assert all(torch.equal(a, b) for a, b in zip(first, run(0, 1, 0), strict=True))
    for other in (run(0, 2, 0), run(0, 1, 1), run(1, 1, 0)):
        assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_an_epoch_draws_distinct_chips_and_times_itself() -> None:
    ds = make_dataset()
    batches = ds.epoch_batches(batch_size=4, steps=5, seed=0, epoch=1, rank=0, augment=False)
    drawn = torch.cat([b.labels for b in batches])
    # Unaugmented labels identify their chip: 20 distinct chips of the 23.
    keys = {tuple(x.flatten().tolist()) for x in drawn}
    all_keys = [tuple(x.flatten().tolist()) for x in ds.labels.to(torch.int64)]
    assert len(keys) == 20 and keys <= set(all_keys)
    assert batches.data_time_s > 0


def test_sequential_batches_cover_the_shard_in_order() -> None:
    ds = make_dataset()
    labels = torch.cat([b.labels for b in ds.sequential_batches(5)])
    assert torch.equal(labels, ds.labels.to(torch.int64))


def test_an_epoch_longer_than_the_shard_is_refused() -> None:
    with pytest.raises(
        TrainingError, match="6 steps of 4 chips need 24 chips but the shard holds 23"
    ):
        make_dataset().epoch_batches(batch_size=4, steps=6, seed=0, epoch=1, rank=0)


@pytest.mark.parametrize(
    ("images_shape", "labels_shape", "mean", "message"),
    [
        ((3, 4, 8, 8), (3, 8, 9), MEAN, "do not describe the same square chips"),
        ((3, 4, 8, 8), (3, 8), MEAN, "expected \\(n, bands, C, C\\) and \\(n, C, C\\)"),
        ((3, 4, 8, 8), (3, 8, 8), MEAN[:3], "3 means and 4 stds for 4 bands"),
    ],
)
def test_bad_shards_are_named(
    images_shape: tuple[int, ...],
    labels_shape: tuple[int, ...],
    mean: tuple[float, ...],
    message: str,
) -> None:
    with pytest.raises(TrainingError, match=message):
        ShardDataset(
            np.zeros(images_shape, np.uint8),
            np.zeros(labels_shape, np.uint8),
            band_mean=mean,
            band_std=STD,
        )


def test_zero_std_and_wrong_dtype_are_refused() -> None:
    images, labels = np.zeros((2, 4, 8, 8), np.uint8), np.zeros((2, 8, 8), np.uint8)
    with pytest.raises(TrainingError, match="must be > 0; re-tile the store"):
        ShardDataset(images, labels, band_mean=MEAN, band_std=(1.0, 0.0, 1.0, 1.0))
    with pytest.raises(TrainingError, match=r"dtype torch\.float32; the chip store holds uint8"):
        ShardDataset(images.astype(np.float32), labels, band_mean=MEAN, band_std=STD)  # type: ignore[arg-type]


def test_dataset_from_a_loaded_store_shard(tiny_store: str) -> None:
    summary = open_store(tiny_store).summary
    shard = load_shard_into_memory(tiny_store, rank=1, world_size=2, split="train")
    assert shard.labels is not None
    ds = ShardDataset(
        shard.images, shard.labels, band_mean=summary.band_mean, band_std=summary.band_std
    )
    assert len(ds) == len(shard.chip_ids) and ds.chip_size == summary.chip_size
    batch = next(iter(ds.epoch_batches(batch_size=4, steps=1, seed=0, epoch=1, rank=1)))
    assert batch.images.shape == (4, 4, summary.chip_size, summary.chip_size)
    # Band stats of the store normalise its own pixels to roughly zero mean, unit std.
    whole = ds.normalize(ds.images)
    assert whole.mean().abs() < 0.5 and 0.5 < whole.std() < 2.0
