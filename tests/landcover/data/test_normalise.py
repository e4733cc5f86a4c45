"""Normalisation: the arithmetic, the band-statistics check, and pixels without data as
the model sees them in training and in prediction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from landcover.data import ShardDataset, check_band_stats
from landcover.errors import TrainingError
from tests.landcover.data.chips import MEAN, STD, make_dataset


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
    from landcover.prediction.blend import WindowLayout
    from landcover.prediction.gridwindow import Window
    from landcover.prediction.windows import BlockPixels, WindowRunner
    from tiling.sources.classes import get_class_map

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
        whole = Window(0, 0, 16, 16)
        block = BlockPixels(images[chip], images[chip].any(axis=0), whole, whole)
        runner.run(block, [(0, 0)])
    assert torch.equal(torch.cat(seen), trained)


def test_every_pixel_valid_is_the_mask_of_all_pixels_bit_for_bit() -> None:
    """`valid=True` (a window inside imagery that covers its whole block) skips the mask and
    gives the same bits as a mask that holds every pixel, zeros in all bands included."""
    from landcover.data.normalise import normalise

    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (3, 4, 17, 19), generator=generator, dtype=torch.uint8)
    pixels[:, :, :2, :2] = 0  # data that is 0 in every band, valid all the same
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, -1, 1, 1)
    everything = torch.ones(3, 17, 19, dtype=torch.bool)
    masked = normalise(pixels.float(), mean, std, valid=everything)
    assert torch.equal(normalise(pixels.float(), mean, std, valid=True), masked)
    assert torch.equal(normalise(pixels, mean, std, valid=True), masked)
