"""How pixels reach a model: `(x - mean) / std` per band, 0 where a pixel has no data.

`normalise` is the one implementation: training (`landcover.data.shards`) and prediction
(`landcover.prediction.windows`) both call it, so a pixel without data looks the same to the
model in both; `check_band_stats` is the one check of the statistics it is given (the store's,
or a model file's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from landcover.errors import LandcoverError


def check_band_stats(
    band_mean: Sequence[float],
    band_std: Sequence[float],
    *,
    bands: int,
    error: type[LandcoverError],
    fix: str,
    where: str = "",
) -> None:
    """Refuse band statistics that `normalise` cannot use: one mean and one std per band, every
    std > 0. Raises `error` with a line that starts with `where` (a file, if any) and ends with
    `fix`; training (the store's stats) and prediction (the model file's) both call this."""
    prefix = f"{where}: " if where else ""
    if len(band_mean) != bands or len(band_std) != bands:
        raise error(
            f"{prefix}band stats have {len(band_mean)} means and {len(band_std)} stds for "
            f"{bands} bands; {fix}"
        )
    if any(not s > 0 for s in band_std):
        raise error(f"{prefix}band std {list(band_std)} must be > 0; {fix}")


def normalise(
    pixels: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    *,
    valid: torch.Tensor | Literal[True] | None = None,
) -> torch.Tensor:
    """Pixels (n, bands, h, w) as the model sees them: float32 `(x - mean) / std` per band, and
    exactly 0 (the band mean) in every band of each pixel that is not valid.

    Training and prediction both call this, so a pixel without data looks the same to the model
    in both. `mean` and `std` broadcast against the pixels ((1, bands, 1, 1)). `valid` is a bool
    (n, h, w) mask, or True where every pixel is valid (a window inside the imagery); by default
    a pixel is valid when any band is non-zero, since the chip store holds pixels without data
    as 0 in all four bands. uint8 pixels give a new tensor; float32 pixels (a fresh batch) are
    normalised in place, which saves a copy of the batch.
    """
    x = pixels if pixels.dtype == torch.float32 else pixels.to(torch.float32)
    if valid is True:
        return x.sub_(mean).div_(std)
    if valid is None:
        valid = (x != 0).any(dim=1)
    elif valid.shape != (x.shape[0], *x.shape[2:]):
        raise ValueError(f"validity mask {tuple(valid.shape)} for pixels {tuple(x.shape)}")  # a bug
    x.sub_(mean).div_(std)
    # masked_fill, not a multiply: invalid pixels become +0.0 (a multiply leaves -0.0).
    return x.masked_fill_(~valid.to(torch.bool).unsqueeze(1), 0.0)
