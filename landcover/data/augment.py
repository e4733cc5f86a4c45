"""Augmentation: the 8 symmetries of the square (flips and 90-degree rotations), applied to a
chip's image and mask alike while it is gathered from the shard into a batch, and undone by
`inverse_dihedral` (test-time augmentation in prediction maps logits back with it); and random
band gains (`random_gains`), so that a model does not learn the brightness of the tiles it
was trained on."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from landcover.errors import TrainingError


def random_ops(n: int, generator: torch.Generator) -> list[int]:
    """One of the 8 symmetries of the square (see `dihedral`) per chip."""
    ops: list[int] = torch.randint(0, 8, (n,), generator=generator).tolist()
    return ops


def random_gains(n: int, bands: int, jitter: float, generator: torch.Generator) -> torch.Tensor:
    """Per-chip band gains (n, bands, 1, 1) for photometric augmentation: a brightness gain in
    [1 - jitter, 1 + jitter] shared by a chip's bands (band ratios such as NDVI kept) times a
    gain per band in [1 - jitter / 2, 1 + jitter / 2] (the colour balance of another flight)."""
    brightness = 1 + jitter * (2 * torch.rand((n, 1, 1, 1), generator=generator) - 1)
    colour = 1 + jitter / 2 * (2 * torch.rand((n, bands, 1, 1), generator=generator) - 1)
    return brightness * colour


def gather_chips(
    images: torch.Tensor,
    labels: torch.Tensor,
    indices: torch.Tensor,
    ops: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chips `indices` of uint8 images (n, b, C, C) and labels (n, C, C) as float32 images and
    int64 labels; chip k under `dihedral(., ops[k])`, the same for image and mask.

    With ops, one strided copy per chip straight from the shard into the batch, converting the
    dtype on the way: a chip stays in cache while it is transposed, which is faster on CPU
    than whole-batch masked selects (`torch.where` per transform) and than gathering uint8
    first and converting the batch after.
    """
    if ops is None:
        where = indices.to(images.device)
        return (
            images.index_select(0, where).to(torch.float32),
            labels.index_select(0, where).to(torch.int64),
        )
    if len(ops) != len(indices):
        raise TrainingError(f"{len(ops)} augmentation ops for {len(indices)} chips")
    n = len(ops)
    out_images = torch.empty((n, *images.shape[1:]), dtype=torch.float32, device=images.device)
    out_labels = torch.empty((n, *labels.shape[1:]), dtype=torch.int64, device=labels.device)
    for slot, (chip, op) in enumerate(zip(indices.tolist(), ops, strict=True)):
        out_images[slot].copy_(dihedral(images[chip], op))
        out_labels[slot].copy_(dihedral(labels[chip], op))
    return out_images, out_labels


def dihedral(x: torch.Tensor, op: int) -> torch.Tensor:
    """Element `op` (0..7) of the square's symmetry group on the last two axes: bit 2
    transposes, bit 0 flips columns, bit 1 flips rows (0 is the identity). May be a view."""
    if op & 4:
        x = x.transpose(-2, -1)
    if op & 1:
        x = x.flip(-1)
    if op & 2:
        x = x.flip(-2)
    return x


def inverse_dihedral(op: int) -> int:
    """The element that undoes `dihedral(., op)`: flips are their own inverses, and a transpose
    followed by flips is undone by the flips, then the transpose, which is the transpose
    followed by the flips with columns and rows swapped."""
    if not 0 <= op < 8:
        raise ValueError(f"dihedral op {op}: must be 0..7")  # a bug, never user input
    if op & 4:
        return 4 | ((op & 1) << 1) | ((op & 2) >> 1)
    return op
