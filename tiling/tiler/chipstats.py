"""Exact statistics of one chip, added up as chips are cut: per-band sums and sums of squares
of the pixel values (the store's band mean and std), and pixels per class code.

Integers throughout, so per-source and per-store totals are the same whatever the order of
the additions (one writer or many ranks). Cut per chip, these are the per-pixel work of
tiling besides reading and compressing: each is written to touch every byte as few times as
numpy allows.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["add_band_sums", "count_classes"]

# Up to this many classes, counting each code (a compare and a count per class) is cheaper
# than np.bincount, which first widens every uint8 code to int64.
_MAX_CLASSES_COUNTED_BY_COMPARE = 16


def add_band_sums(
    chip: npt.NDArray[np.uint8], sums: npt.NDArray[np.uint64], sums_sq: npt.NDArray[np.uint64]
) -> None:
    """Add the per-band sums and sums of squares of `chip` (bands, h, w) to `sums`, `sums_sq`.

    Over every pixel: the reader returns invalid pixels as 0 in every band, and they add
    nothing, so no gather of the valid ones is needed. Squares in uint16 (255² fits), summed
    in uint32 where a band's sum of squares fits (chips up to 257 px), else in uint64: a
    quarter of the memory traffic of squares in uint32 summed in uint64.
    """
    wide = chip.reshape(chip.shape[0], -1).astype(np.uint16)
    total = np.uint32 if wide.shape[1] * 255 * 255 < 2**32 else np.uint64
    sums += wide.sum(axis=1, dtype=total)
    np.multiply(wide, wide, out=wide)
    sums_sq += wide.sum(axis=1, dtype=total)


def count_classes(codes: npt.NDArray[np.uint8], num_classes: int) -> npt.NDArray[np.int64]:
    """Pixels of each class code 0..num_classes-1 in `codes` (np.bincount's counts)."""
    if num_classes > _MAX_CLASSES_COUNTED_BY_COMPARE:
        return np.bincount(codes.ravel(), minlength=num_classes)[:num_classes]
    counts = np.empty(num_classes, dtype=np.int64)
    if num_classes:
        counts[0] = codes.size - np.count_nonzero(codes)
    for code in range(1, num_classes):
        counts[code] = np.count_nonzero(codes == code)
    return counts
