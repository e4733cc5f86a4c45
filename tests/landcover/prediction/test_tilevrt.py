"""The VRT over a tiled map's tiles (`landcover.prediction.tilevrt`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import rasterio
from affine import Affine

from landcover.prediction.tilevrt import VrtTile, write_tile_vrt

TRANSFORM = Affine(2.0, 0.0, 500.0, 0.0, -2.0, 900.0)
COLORS = {0: (0, 0, 0, 0), 1: (10, 20, 30, 255), 2: (200, 100, 0, 255)}


def _tile(path: Path, pixels: np.ndarray, row0: int, col0: int) -> VrtTile:
    height, width = pixels.shape
    with rasterio.open(
        path, "w", driver="GTiff", width=width, height=height, count=1, dtype="uint8",
        crs="EPSG:32618", transform=TRANSFORM @ Affine.translation(col0, row0), nodata=0,
    ) as ds:  # fmt: skip
        ds.write(pixels, 1)
        ds.write_colormap(1, COLORS)
        ds.update_tags(1, KIND="tile")
    return VrtTile(path.name, row0, col0, height, width)


def test_the_vrt_shows_the_tiles_at_their_places_with_the_first_tiles_colours(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    whole = rng.integers(0, 3, size=(7, 11), dtype=np.uint8)
    tiles = [
        _tile(tmp_path / "a.tif", whole[:, :6], 0, 0),
        _tile(tmp_path / "b.tif", whole[:4, 6:], 0, 6),
        _tile(tmp_path / "c.tif", whole[4:, 6:], 4, 6),
    ]
    vrt = str(tmp_path / "mosaic.vrt")
    edited: list[str] = []
    write_tile_vrt(
        vrt, str(tmp_path / "a.tif"), tiles, transform=TRANSFORM, width=11, height=7,
        edit=lambda root: edited.append(root.tag),
    )  # fmt: skip
    assert edited == ["VRTDataset"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tif", "b.tif", "c.tif", "mosaic.vrt"]
    with rasterio.open(vrt) as ds:
        assert (ds.width, ds.height, ds.transform) == (11, 7, TRANSFORM)
        assert np.array_equal(ds.read(1), whole)
        assert ds.colormap(1)[2] == COLORS[2]
        assert ds.tags(1)["KIND"] == "tile"
    assert 'relativeToVRT="1">b.tif<' in Path(vrt).read_text()
