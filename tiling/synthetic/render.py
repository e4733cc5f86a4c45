"""Rendering one synthetic scene (`tiling.synthetic.scenes`): surfaces from the world's fields and
layers, NAIP-like digital numbers with texture, vigour, shadows and haze, and the scene's nodata."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tiling.synthetic.surfaces import (
    IMAGE_NODATA,
    IMPERVIOUS,
    LABEL_NODATA,
    LABEL_OF,
    LOW_VEG,
    MAT,
    MEAN,
    SHADOW_GAIN,
    TEXTURE,
    TREE,
    TURBID_WATER,
    VARIATION,
    VARIATION_GAIN,
    VIGOUR,
    VIGOUR_GAIN,
)
from tiling.synthetic.world import (
    BARREN_PATCH,
    CONIFER,
    CROWN,
    DETAIL,
    DEVELOPED,
    F32,
    FOREST,
    HAZE,
    LAKE,
    TURBIDITY,
    URBAN_TREES,
    VIGOUR_FIELD,
    Mask,
    SceneWindow,
    World,
)

# Each scene is rendered with this margin so blurs and shadows see across its edges.
MARGIN_PX = 24


def render_scene(
    world: World, row0: int, col0: int, size: int, res_m: float, rng: np.random.Generator
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The image (4, size, size) and the labels with a margin (size + 2 * margin) squared."""
    m, seed, t = MARGIN_PX, world.seed, world.thresholds
    window = SceneWindow(row0 - m, col0 - m, size + 2 * m, size + 2 * m, res_m)
    x, y = window.centres()

    tint = world.parcels.burn(window)
    surface = np.concatenate([[MAT["pasture"]], world.parcels.surface])[tint]
    developed = DEVELOPED.on_grid(seed, x, y) > t["developed"]
    surface[developed & (LABEL_OF[surface] == LOW_VEG)] = MAT["lawn"]
    detail = DETAIL.on_grid(seed, x, y)
    patch = BARREN_PATCH.on_grid(seed, x, y) > t["barren"]
    surface[patch] = np.where(detail[patch] > 0, MAT["gravel"], MAT["soil"])
    tint[patch] = 0

    forest = FOREST.on_grid(seed, x, y)
    trees = (forest > t["forest"]) | (world.hedges.burn(window) > 0)
    trees |= (world.riparian.burn(window) > 0) & (forest > t["riparian"])
    trees |= developed & (URBAN_TREES.on_grid(seed, x, y) > 0.28)  # ~20 % of yards
    conifer = CONIFER.on_grid(seed, x, y) > 0.15  # ~35 % of stands
    surface[trees] = np.where(conifer[trees], MAT["conifer"], MAT["deciduous"])
    water = (LAKE.on_grid(seed, x, y) > t["lake"]) | (world.waterways.burn(window) > 0)
    surface[water] = MAT["water"]
    tint[trees | water] = 0
    for layer in (world.parking, world.buildings, world.roads):
        ids = layer.burn(window)
        hit = ids > 0
        surface[hit] = layer.surface[ids[hit] - 1]
        tint[hit] = ids[hit] + layer.offset
    labels = LABEL_OF[surface]

    # Texture: tree crowns with dark gaps between them, a little grain on everything else.
    crown = CROWN.on_grid(seed, x, y)
    is_tree = labels == TREE
    gain = 1 + TEXTURE[surface] * crown
    gain[is_tree & (crown < -0.3)] *= 0.62  # ~20 % of the canopy in the gaps
    gain *= 1 + 0.05 * HAZE.on_grid(seed, x, y)
    shadow = _shadow(is_tree, round(6 / res_m)) | _shadow(labels == IMPERVIOUS, round(8 / res_m))
    shadow &= ~is_tree
    wy, wx = np.nonzero(water)  # turbidity only where there is water: cheaper than a grid
    turbid = np.clip(0.45 + 1.6 * TURBIDITY.at(seed, x[wx], y[wy]), 0, 1)
    variation = VARIATION[surface] * detail
    vigour = VIGOUR[surface] * VIGOUR_FIELD.on_grid(seed, x, y)

    image = np.empty((4, size, size), dtype=np.uint8)
    gains = rng.uniform(0.94, 1.06, 4)  # per scene, like separate flight lines
    offsets = rng.uniform(-5, 5, 4)
    for b in range(4):
        band = MEAN[b][surface]
        band += world.tints[b][tint]
        band += variation * VARIATION_GAIN[b]
        band += vigour * VIGOUR_GAIN[b]
        band[water] += turbid * (TURBID_WATER[b] - MEAN[b][MAT["water"]])
        band *= gain
        band[shadow] *= SHADOW_GAIN[b]
        band = _blur3(band)[m - 1 : 1 - m, m - 1 : 1 - m]
        band += rng.standard_normal(band.shape, dtype=np.float32) * np.float32(2.0)
        band *= np.float32(gains[b])
        band += np.float32(offsets[b])
        image[b] = np.clip(np.rint(band), 1, 255)  # 0 is the image nodata value
    return image, labels


def _shadow(objects: Mask, length_px: int) -> Mask:
    """Pixels north (and a little west) of an object: NAIP is flown near noon."""
    shadow = np.zeros_like(objects)
    for step in range(1, max(length_px, 1) + 1):
        dx = step // 3
        shadow[:-step, : shadow.shape[1] - dx] |= objects[step:, dx:]
    return shadow & ~objects


def _blur3(a: F32) -> F32:
    """1-2-1 binomial blur both ways (the camera's point spread, so edges mix); one pixel
    shorter on every side."""
    v = a[1:-1] * np.float32(2)
    v += a[:-2]
    v += a[2:]
    out = v[:, 1:-1] * np.float32(2)
    out += v[:, :-2]
    out += v[:, 2:]
    out *= np.float32(1 / 16)
    return out


def apply_nodata(
    image: npt.NDArray[np.uint8], labels: npt.NDArray[np.uint8], k: int, scenes: int, size: int
) -> None:
    """A label-only strip along the world's top edge (outside the label survey) in the first
    scene, and an image nodata corner (edge of the flight) in the last one, both at the
    world's outer edge so every scene seam stays valid."""
    m = MARGIN_PX
    if k == 0:
        labels[: m + max(3, size // 100), m : m + size] = LABEL_NODATA
    if k == scenes - 1:
        r = np.arange(labels.shape[0]) - m
        corner = (size - 1 - r)[:, None] + (size - 1 - r)[None, :] < size // 8
        labels[corner] = LABEL_NODATA
        image[:, corner[m:-m, m:-m]] = IMAGE_NODATA
