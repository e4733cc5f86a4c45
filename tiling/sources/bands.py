"""The bands of an input image, in the order the chip store keeps them (NAIP: red,
green, blue, near-infrared). The one owner of the band order and count: inputs choose a
STAC asset by it, the store lays out its arrays by it (`tiling.chipstore.records`)."""

BANDS: tuple[str, ...] = ("red", "green", "blue", "nir")
NUM_BANDS = len(BANDS)
