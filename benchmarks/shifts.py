"""Radiometric shifts between NAIP flights, as pure functions of a scene's pixels, for the
cross-scene protocol of `benchmarks/bench_quality.py`.

A scene is a (4, H, W) uint8 array, bands R, G, B, NIR; a pixel that is 0 in every band is
nodata (the product's rule for images without a declared nodata) and stays 0. A pixel with
data never becomes 0 in every band (values are clipped to 1..255), so a shift neither adds nor
removes nodata.

The shifts are the kinds that differ between two flights over the same ground:

- `gain`: sensor gain and sun elevation, every band scaled alike;
- `gamma`: a different tone curve in the mosaicking and compression of the product;
- `band_offsets`: path radiance (haze) that adds most to blue and least to NIR, or its
  over-correction, which subtracts it;
- `season_histogram`: another season. Each band's histogram is matched to the histogram of
  the same scene with leaf-off vegetation (`leaf_off`: NIR down and red up where the scene is
  greenest), so the whole band takes a monotone tone curve, as a flight in another season gives,
  rather than a per-pixel relabelling of the vegetation.

`SHIFTS` lists the shifted sets the protocol predicts, grouped into `VIEWS`. `mosaic` lays a
scene's patches side by side with a gap of fill between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Pixels = npt.NDArray[np.uint8]
Floats = npt.NDArray[np.float32]
BANDS = ("red", "green", "blue", "nir")
RED, GREEN, BLUE, NIR = range(4)


def data_mask(pixels: Pixels) -> npt.NDArray[np.bool_]:
    """(H, W): the pixels with data, i.e. not 0 in every band."""
    return np.asarray(pixels.any(axis=0))


def _to_pixels(values: Floats, has_data: npt.NDArray[np.bool_]) -> Pixels:
    """`values` rounded into 1..255 where there is data, 0 elsewhere."""
    out = np.clip(np.rint(values), 1, 255).astype(np.uint8)
    out[:, ~has_data] = 0
    return out


def gain(pixels: Pixels, factor: float) -> Pixels:
    """Every band multiplied by `factor`: a brighter or darker flight."""
    return _to_pixels(pixels.astype(np.float32) * np.float32(factor), data_mask(pixels))


def gamma(pixels: Pixels, exponent: float) -> Pixels:
    """255 * (v / 255) ** `exponent` per band: above 1 darkens the mid-tones, below 1
    brightens them; 0 and 255 stay."""
    scaled = (pixels.astype(np.float32) / 255.0) ** np.float32(exponent)
    return _to_pixels(scaled * 255.0, data_mask(pixels))


def band_offsets(pixels: Pixels, offsets: Sequence[float]) -> Pixels:
    """`offsets[b]` added to band b (R, G, B, NIR), in digital numbers."""
    if len(offsets) != pixels.shape[0]:
        raise ValueError(f"{len(offsets)} offsets for {pixels.shape[0]} bands")
    add = np.asarray(offsets, dtype=np.float32).reshape(-1, 1, 1)
    return _to_pixels(pixels.astype(np.float32) + add, data_mask(pixels))


def greenness(pixels: Pixels) -> Floats:
    """(H, W) in [0, 1]: how green a pixel is relative to the rest of its scene, from its
    NDVI: 0 at the scene's 10th percentile or less, 1 at its 90th or more (NAIP's digital
    numbers are not calibrated: one flight's vegetation sits near NDVI 0, another's at 0.5).
    0 where there is no data."""
    red = pixels[RED].astype(np.float32)
    nir = pixels[NIR].astype(np.float32)
    ndvi = (nir - red) / np.maximum(nir + red, 1.0)
    has_data = data_mask(pixels)
    if not has_data.any():
        return np.zeros(ndvi.shape, dtype=np.float32)
    low, high = (float(q) for q in np.percentile(ndvi[has_data], [10, 90]))
    weight: Floats = np.clip((ndvi - low) / max(high - low, 1e-6), 0.0, 1.0).astype(np.float32)
    weight[~has_data] = 0.0
    return weight


def leaf_off(pixels: Pixels, strength: float = 0.35) -> Pixels:
    """The scene with its vegetation out of leaf: where it is green (`greenness` w), NIR times
    1 - strength * w, red times 1 + strength * w, green times 1 - strength * w / 3."""
    weight = greenness(pixels) * np.float32(strength)
    values = pixels.astype(np.float32)
    values[NIR] *= 1 - weight
    values[RED] *= 1 + weight
    values[GREEN] *= 1 - weight / 3
    return _to_pixels(values, data_mask(pixels))


def match_histograms(pixels: Pixels, target: Pixels) -> Pixels:
    """Each band of `pixels` remapped so that its histogram over the pixels with data is the
    histogram of the same band of `target` over its own (quantile matching: a monotone curve
    per band, the same value always maps to the same value)."""
    if pixels.shape[0] != target.shape[0]:
        raise ValueError(f"{pixels.shape[0]} bands to match to {target.shape[0]}")
    has_data, target_data = data_mask(pixels), data_mask(target)
    if not has_data.any() or not target_data.any():
        return pixels.copy()
    out = pixels.astype(np.float32)
    for band in range(pixels.shape[0]):
        source = pixels[band][has_data]
        counts = np.bincount(source, minlength=256).astype(np.float64)
        wanted = np.bincount(target[band][target_data], minlength=256).astype(np.float64)
        # the quantile of each source value (mid-rank), read off the target's quantile function
        # (the target's values that occur, at their mid-ranks: a scene matched to itself
        # keeps every value)
        source_q = (np.cumsum(counts) - counts / 2) / counts.sum()
        occurs = wanted > 0
        target_q = ((np.cumsum(wanted) - wanted / 2) / wanted.sum())[occurs]
        curve = np.interp(source_q, target_q, np.flatnonzero(occurs).astype(np.float64))
        out[band] = curve[pixels[band]].astype(np.float32)
    return _to_pixels(out, has_data)


def season_histogram(pixels: Pixels, strength: float = 0.35) -> Pixels:
    """Each band's histogram matched to the scene's own leaf-off rendering (`leaf_off`)."""
    return match_histograms(pixels, leaf_off(pixels, strength))


@dataclass(frozen=True, slots=True)
class Shift:
    """One shifted set: `view` groups the sets that are scored together."""

    name: str
    view: str
    description: str
    apply: Callable[[Pixels], Pixels]


# Haze adds path radiance falling with wavelength; a flight over-corrected for it loses it.
HAZE_DN = (10.0, 8.0, 14.0, 3.0)
DEHAZE_DN = (-10.0, -8.0, -14.0, -3.0)

SHIFTS: tuple[Shift, ...] = (
    Shift("gain-0.85", "gain", "every band x 0.85", lambda p: gain(p, 0.85)),
    Shift("gain-1.15", "gain", "every band x 1.15", lambda p: gain(p, 1.15)),
    Shift(
        "gamma-0.8", "gamma", "tone curve gamma 0.8 (brighter mid-tones)", lambda p: gamma(p, 0.8)
    ),
    Shift(
        "gamma-1.25", "gamma", "tone curve gamma 1.25 (darker mid-tones)", lambda p: gamma(p, 1.25)
    ),
    Shift(
        "haze", "offsets", f"band offsets {HAZE_DN} DN (haze)", lambda p: band_offsets(p, HAZE_DN)
    ),
    Shift(
        "dehaze",
        "offsets",
        f"band offsets {DEHAZE_DN} DN (over-corrected haze)",
        lambda p: band_offsets(p, DEHAZE_DN),
    ),
    Shift(
        "leaf-off",
        "season",
        "each band's histogram matched to a leaf-off rendering",
        season_histogram,
    ),
)
VIEWS: tuple[str, ...] = tuple(dict.fromkeys(s.view for s in SHIFTS))


def mosaic(parts: Sequence[npt.NDArray[np.uint8]], gap_px: int, fill: int) -> npt.NDArray[np.uint8]:
    """`parts` ((..., H, W_i) arrays of one height) side by side, left to right, with
    `gap_px` columns of `fill` between neighbours: the patches of one held-out set as one
    scene, each far enough from the next that no prediction window sees two."""
    if not parts:
        raise ValueError("no parts to lay side by side")
    heights = {p.shape[-2] for p in parts}
    if len(heights) != 1:
        raise ValueError(f"parts of different heights {sorted(heights)}")
    gap = np.full((*parts[0].shape[:-1], gap_px), fill, dtype=np.uint8)
    pieces: list[npt.NDArray[np.uint8]] = []
    for i, part in enumerate(parts):
        if i:
            pieces.append(gap)
        pieces.append(part.astype(np.uint8))
    return np.concatenate(pieces, axis=-1)
