"""The label index's rule written out pairwise, for tests that check the index against it."""

from __future__ import annotations

from tiling.sources.labels import footprint_in
from tiling.sources.rasters import RasterInfo


def pairwise_matches(image: RasterInfo, labels: list[RasterInfo]) -> tuple[RasterInfo, ...]:
    """The rule the index must give: every label whose bounds overlap the image's footprint
    in that label's CRS, in the labels' order."""
    hits = []
    for lab in labels:
        a, b = footprint_in(image, lab.crs), lab.bounds
        if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
            hits.append(lab)
    return tuple(hits)
