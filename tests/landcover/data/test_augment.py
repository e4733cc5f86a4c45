"""Augmentation: the eight symmetries of the square, drawn per chip, applied to image and mask
together."""

from __future__ import annotations

import numpy as np
import torch

from landcover.data import dihedral, gather_chips, inverse_dihedral, random_ops
from tests.landcover.data.chips import make_dataset


def test_dihedral_ops_are_the_eight_symmetries_of_a_square() -> None:
    x = torch.arange(16).view(4, 4)
    results = {tuple(dihedral(x, op).flatten().tolist()) for op in range(8)}
    a = x.numpy()
    numpy_group = {tuple(np.rot90(m, k).flatten()) for m in (a, a.T) for k in range(4)}
    assert results == numpy_group


def test_inverse_dihedral_undoes_each_symmetry() -> None:
    x = torch.arange(2 * 3 * 3).view(2, 3, 3)
    for op in range(8):
        assert torch.equal(dihedral(dihedral(x, op), inverse_dihedral(op)), x), op
    # The transposes with one flip (the rotations by 90 and 270 degrees) are each other's.
    assert [inverse_dihedral(op) for op in range(8)] == [0, 1, 2, 3, 4, 6, 5, 7]


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
