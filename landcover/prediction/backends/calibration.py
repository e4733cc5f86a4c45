"""The chips that calibrate an int8 model (`--calibration STORE`): a fixed sample of a chip
store, normalised as prediction normalises a window.

The sample is a pure function of the store and the model's band statistics:
`CALIBRATION_CHIPS` train chips evenly spaced in store order (all chips where the store has no
train split), read with the store's own reader (`tiling.chipstore.store.open_store`, every
checksum checked) and normalised by `landcover.data.normalise` with the model file's means and
stds (a pixel 0 in every band is nodata, 0 to the model, as in training and prediction). Its
digest, the SHA-256 of the normalised float32 chips, is one of the keys of the quantized model
(`landcover.prediction.backends.quantize`) and is recorded in the map's tags, so every rank,
tile and task quantizes the same bits and a part made with another sample is never reused.

Without `--calibration`, the store the model was trained on (its metadata's `training.store`)
is the default where it can be read; otherwise int8 is refused in one line asking for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from landcover.data.normalise import normalise
from landcover.errors import PredictionError, reason
from landcover.models.modelfile import ModelMeta
from landcover.prediction.choices import CALIBRATION_CHIPS, WINDOW_MULTIPLE_PX
from tiling.chipstore.store import NUM_BANDS, ChipStore, open_store
from tiling.errors import TilingError

__all__ = ["CalibrationSample", "calibration_sample", "sample_chip_ids"]


@dataclass(frozen=True, slots=True)
class CalibrationSample:
    """The normalised chips (n, bands, C, C) that calibrate a quantized model, the store they
    came from and their digest."""

    store: str
    chips: npt.NDArray[np.float32]
    digest: str  # SHA-256 of the shape and the float32 bytes of `chips`

    @property
    def key(self) -> str:
        """`STORE@DIGEST`: the value `PredictConfig.calibration` carries once it is read."""
        return f"{self.store}@{self.digest}"


def sample_chip_ids(store: ChipStore, count: int = CALIBRATION_CHIPS) -> npt.NDArray[np.int64]:
    """Up to `count` train chips (all chips without a train split), evenly spaced in store
    order: the first and the last included."""
    ids = store.chip_ids("train")
    if ids.size == 0:
        ids = store.chip_ids("all")
    if ids.size <= count:
        return ids
    picks = np.unique(np.linspace(0, ids.size - 1, count).round().astype(np.int64))
    return ids[picks]


def calibration_sample(
    calibration: str | None,
    meta: ModelMeta,
    *,
    model: str,
    storage_options: Mapping[str, Any] | None = None,
) -> CalibrationSample:
    """The calibration sample of `calibration` (a chip store's URL) for a model of metadata
    `meta`; None: the model's training store where it can be read. `PredictionError` in one
    line for a store that cannot be read, one without chips, chips of an edge the model never
    predicts (not a multiple of its WINDOW_MULTIPLE_PX stride: their ranges are not a
    window's), or bands the model does not take."""
    url, store = _open(calibration, meta, model=model, storage_options=storage_options)
    chip_px = store.summary.chip_size
    if chip_px % WINDOW_MULTIPLE_PX:
        raise PredictionError(
            f"--calibration {url}: its chips are {chip_px} px, an edge the model never predicts "
            f"(windows are multiples of {WINDOW_MULTIPLE_PX} px); give a store tiled with "
            f"--chip-size {meta.chip_size}, the model's chip"
        )
    if meta.in_channels != NUM_BANDS:
        raise PredictionError(
            f"--calibration {url}: its chips have {NUM_BANDS} bands, the model takes "
            f"{meta.in_channels} ({', '.join(meta.band_names)}); predict with --precision fp32"
        )
    ids = sample_chip_ids(store)
    if ids.size == 0:
        raise PredictionError(
            f"--calibration {url}: the store has no chips; give a store that `landcover tile` "
            "finished"
        )
    try:
        images, _ = store.read_chips(ids)
    except (TilingError, OSError) as exc:
        raise PredictionError(f"--calibration {url}: {_why(exc)}") from None
    mean = torch.tensor(meta.band_mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(meta.band_std, dtype=torch.float32).view(1, -1, 1, 1)
    chips = normalise(torch.from_numpy(np.ascontiguousarray(images)), mean, std).numpy()
    digest = hashlib.sha256(repr(chips.shape).encode())
    digest.update(np.ascontiguousarray(chips, dtype="<f4").tobytes())
    return CalibrationSample(url, chips, digest.hexdigest())


def _open(
    calibration: str | None,
    meta: ModelMeta,
    *,
    model: str,
    storage_options: Mapping[str, Any] | None,
) -> tuple[str, ChipStore]:
    """The calibration store's URL and the store, opened: `calibration`, or the model's
    training store."""
    if calibration is not None:
        try:
            return calibration, open_store(calibration, storage_options=storage_options)
        except (TilingError, OSError) as exc:
            raise PredictionError(f"--calibration {calibration}: {_why(exc)}") from None
    trained_on = meta.training.get("store")
    if isinstance(trained_on, str) and trained_on:
        try:
            return trained_on, open_store(trained_on, storage_options=storage_options)
        except (TilingError, OSError):
            pass  # moved or deleted since training: refused below, naming it
    where = f" (its training store {trained_on} cannot be read)" if trained_on else ""
    raise PredictionError(
        f"--precision int8: {model} needs chips to calibrate on{where}; pass --calibration "
        "STORE, a chip store from `landcover tile`"
    )


def _why(exc: TilingError | OSError) -> str:
    """Why the store cannot be read, in one line: a `TilingError`'s whole message (one line
    written by tiling, naming the store and its fix; cut at a line break in the store's own
    URL, the fix would be lost), an OSError's reason."""
    return str(exc) if isinstance(exc, TilingError) else reason(exc)
