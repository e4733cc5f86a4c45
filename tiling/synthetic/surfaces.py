"""The surfaces of the synthetic scenes (`tiling.synthetic.scenes`): their Chesapeake label and
their NAIP-like digital numbers, with the class codes and nodata values the scenes use."""

from __future__ import annotations

import numpy as np

from tiling.sources.classes import CHESAPEAKE_NODATA_RAW

WATER, TREE, LOW_VEG, BARREN, IMPERVIOUS, ROAD = 1, 2, 3, 4, 5, 6
LABEL_NODATA = CHESAPEAKE_NODATA_RAW
IMAGE_NODATA = 0

# Surfaces: (name, label, mean R, G, B, NIR digital numbers, within-object variation in DN,
# fine-texture amplitude, NIR vigour in DN). Class overlaps are deliberate: NDVI of trees meets
# that of crops, pasture and lawns (trees are darker and textured instead), soil meets concrete
# and roofs in RGB, shadowed fields meet turbid water in NIR.
SURFACES: tuple[tuple[str, int, tuple[float, float, float, float], float, float, float], ...] = (
    ("nodata", LABEL_NODATA, (0, 0, 0, 0), 0, 0, 0),
    ("water", WATER, (38, 52, 58, 20), 4, 0.03, 0),
    ("deciduous", TREE, (62, 84, 64, 146), 10, 0.40, 34),
    ("conifer", TREE, (46, 64, 56, 112), 8, 0.40, 26),
    ("crop_green", LOW_VEG, (72, 102, 64, 172), 12, 0.04, 26),
    ("crop_yellow", LOW_VEG, (120, 126, 90, 150), 12, 0.05, 20),
    ("pasture", LOW_VEG, (92, 114, 82, 160), 12, 0.07, 26),
    ("hay", LOW_VEG, (142, 138, 108, 130), 12, 0.07, 16),
    ("lawn", LOW_VEG, (84, 110, 78, 162), 10, 0.08, 26),
    ("soil", BARREN, (140, 120, 100, 126), 14, 0.08, 6),
    ("gravel", BARREN, (166, 158, 146, 150), 10, 0.10, 0),
    ("roof_light", IMPERVIOUS, (170, 168, 164, 156), 6, 0.03, 0),
    ("roof_dark", IMPERVIOUS, (82, 82, 86, 78), 6, 0.03, 0),
    ("roof_red", IMPERVIOUS, (150, 92, 80, 98), 6, 0.03, 0),
    ("roof_white", IMPERVIOUS, (220, 220, 216, 204), 6, 0.03, 0),
    ("parking", IMPERVIOUS, (118, 118, 116, 110), 8, 0.05, 0),
    ("asphalt", ROAD, (84, 84, 88, 80), 6, 0.06, 0),
    ("concrete", ROAD, (148, 146, 140, 134), 6, 0.05, 0),
)
MAT = {name: i for i, (name, *_rest) in enumerate(SURFACES)}
LABEL_OF = np.array([s[1] for s in SURFACES], dtype=np.uint8)
MEAN = np.array([s[2] for s in SURFACES], dtype=np.float32).T.copy()  # (4, surfaces)
VARIATION = np.array([s[3] for s in SURFACES], dtype=np.float32)
TEXTURE = np.array([s[4] for s in SURFACES], dtype=np.float32)
VIGOUR = np.array([s[5] for s in SURFACES], dtype=np.float32)
TURBID_WATER = np.array([92, 102, 86, 58], dtype=np.float32)
VARIATION_GAIN = np.array([0.8, 0.9, 0.7, 1.0], dtype=np.float32)
VIGOUR_GAIN = np.array([-0.25, 0.1, -0.1, 1.0], dtype=np.float32)  # healthy: more NIR, less red
SHADOW_GAIN = np.array([0.55, 0.56, 0.60, 0.48], dtype=np.float32)
CROPS = ("crop_green", "crop_yellow", "pasture", "hay", "soil")
CROP_SHARE = (0.28, 0.18, 0.28, 0.20, 0.06)
ROOFS = ("roof_light", "roof_dark", "roof_red", "roof_white")
