"""The in-RAM shard dataset: batches, augmentation, normalisation, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from landcover.data.shards import (
    ShardDataset,
    check_band_stats,
    derive_seed,
    dihedral,
    gather_chips,
    random_ops,
    steps_per_epoch,
)
from landcover.errors import TrainingError
from tiling.store import load_shard_into_memory, open_store

MEAN = (100.0, 90.0, 80.0, 120.0)
STD = (40.0, 30.0, 20.0, 50.0)


def make_dataset(n: int = 23, chip: int = 12, seed: int = 0) -> ShardDataset:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 4, chip, chip), dtype=np.uint8)
    # Labels that are a function of the image, so a joint transform keeps them in register.
    labels = (images[:, 0] % 5).astype(np.uint8)
    return ShardDataset(images, labels, band_mean=MEAN, band_std=STD)


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


def test_normalisation_is_prediction_arithmetic() -> None:
    ds = make_dataset()
    batch = ds.batch(torch.arange(5))
    mean = np.array(MEAN, np.float32).reshape(1, 4, 1, 1)
    std = np.array(STD, np.float32).reshape(1, 4, 1, 1)
    expected = (ds.images[:5].numpy().astype(np.float32) - mean) / std
    assert batch.images.dtype == torch.float32
    np.testing.assert_array_equal(batch.images.numpy(), expected)
    assert batch.labels.dtype == torch.int64
    np.testing.assert_array_equal(batch.labels.numpy(), ds.labels[:5].numpy())


def test_dihedral_ops_are_the_eight_symmetries_of_a_square() -> None:
    x = torch.arange(16).view(4, 4)
    results = {tuple(dihedral(x, op).flatten().tolist()) for op in range(8)}
    a = x.numpy()
    numpy_group = {tuple(np.rot90(m, k).flatten()) for m in (a, a.T) for k in range(4)}
    assert results == numpy_group


def test_augmentation_moves_image_and_mask_together() -> None:
    ds = make_dataset()
    indices = torch.tensor([4, 0, 22, 9, 9, 13, 2, 17])
    ops = random_ops(len(indices), torch.Generator().manual_seed(3))
    images, labels = gather_chips(ds.images, ds.labels, indices, ops)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert torch.equal(labels, images[:, 0].to(torch.int64) % 5)
    for slot, (chip, op) in enumerate(zip(indices.tolist(), ops, strict=True)):
        assert torch.equal(images[slot], dihedral(ds.images[chip], op).float())
    # Without ops: the chips as they are.
    plain, _ = gather_chips(ds.images, ds.labels, indices)
    assert torch.equal(plain, ds.images[indices].float())


def test_every_symmetry_is_drawn() -> None:
    ops = random_ops(200, torch.Generator().manual_seed(0))
    assert set(ops) == set(range(8))
    assert ops == random_ops(200, torch.Generator().manual_seed(0))


def test_augmented_batches_are_normalised_like_plain_ones() -> None:
    ds = make_dataset()
    indices = torch.arange(6)
    augmented = ds.batch(indices, generator=torch.Generator().manual_seed(1))
    plain = ds.batch(indices)
    # A symmetry permutes pixels: per-chip sorted values match exactly.
    for a, b in zip(augmented.images, plain.images, strict=True):
        assert torch.equal(a.flatten().sort().values, b.flatten().sort().values)


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


def test_band_stats_check_names_the_file_and_the_fix() -> None:
    """One check for the store's stats (training) and the model file's (prediction)."""
    check_band_stats(MEAN, STD, bands=4, error=TrainingError, fix="re-tile the store")
    with pytest.raises(
        TrainingError, match=r"^m\.pt: band stats have 4 means and 3 stds for 4 bands; fix it$"
    ):
        check_band_stats(MEAN, STD[:3], bands=4, error=TrainingError, fix="fix it", where="m.pt")
    with pytest.raises(TrainingError, match=r"band std \[1\.0, nan, 1\.0, 1\.0\] must be > 0"):
        ShardDataset(
            np.zeros((2, 4, 8, 8), np.uint8),
            np.zeros((2, 8, 8), np.uint8),
            band_mean=MEAN,
            band_std=(1.0, float("nan"), 1.0, 1.0),
        )


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


def _chips_with_missing_pixels() -> tuple[np.ndarray, np.ndarray]:
    """2 chips of 16 px; a corner without data (0 in all four bands, as the store holds it) and
    a pixel that is 0 in three bands only (real data: it stays)."""
    rng = np.random.default_rng(5)
    images = rng.integers(1, 256, (2, 4, 16, 16), dtype=np.uint8)
    images[0, :, :5, :7] = 0
    images[1, :, 10:, 3:] = 0
    images[1, :3, 2, 2] = 0
    labels = np.where(images.any(axis=1), 1 + images[:, 0] % 4, 0).astype(np.uint8)
    return images, labels


def test_pixels_without_data_are_the_band_mean_in_training_and_prediction() -> None:
    """Training (ShardDataset batches, augmented or not) and prediction (`WindowRunner`, which
    gets a validity mask from the mosaic) hand the model the same tensor for the same pixels:
    0 in every band where there is no data, never (0 - mean) / std."""
    from landcover.models.modelfile import ModelMeta
    from landcover.prediction.blend import LogitBlender, WindowLayout
    from landcover.prediction.windows import Block, WindowRunner
    from tiling.classes import get_class_map

    images, labels = _chips_with_missing_pixels()
    ds = ShardDataset(images, labels, band_mean=MEAN, band_std=STD)
    trained = ds.batch(torch.arange(2)).images
    missing = torch.from_numpy(~images.any(axis=1))
    assert missing.sum() == 5 * 7 + 6 * 13
    assert torch.equal(trained.permute(1, 0, 2, 3)[:, missing], torch.zeros(4, int(missing.sum())))
    assert trained[1, :, 2, 2].ne(0).all()  # 0 in three bands is data
    augmented = ds.batch(torch.arange(2), generator=torch.Generator().manual_seed(0)).images
    assert int((augmented == 0).all(dim=1).sum()) == int(missing.sum())

    seen: list[torch.Tensor] = []

    class Recorder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.clone())
            return torch.zeros(x.shape[0], 5, *x.shape[2:])

    meta = ModelMeta(
        architecture="recorder",
        class_map=get_class_map("chesapeake7to5"),  # 5 codes
        band_names=("red", "green", "blue", "nir"),
        band_mean=MEAN,
        band_std=STD,
        chip_size=16,
        resolution_m=1.0,
    )
    layout = WindowLayout.over(16, 16, size=16, overlap=0)
    runner = WindowRunner(Recorder(), meta, layout, batch_size=16, where="m.pt", device="cpu")
    for chip in range(2):
        block = Block(images[chip], images[chip].any(axis=0), 0, 0, 0, 0, 16, 16)
        runner.run(block, [(0, 0)], LogitBlender(layout, 5, 0, 0, 16, 16))
    assert torch.equal(torch.cat(seen), trained)
