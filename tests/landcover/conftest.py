"""Fixtures of the landcover tests: a tiny synthetic chip store, built once per session.

Two 448 x 448 px synthetic NAIP-like scenes (exactly 7 x 7 chips of 64 px: the tiler's edge
handling is tested in tests/tiling; the training tests rely on the step counts this size gives,
e.g. an epoch that ends mid-block for BMUF) tiled into a store with 64 px chips, a quarter of
the chip blocks held out as the spatial val split: ~70 train and ~25 val chips, enough for a
few DDP steps on two workers and for small_unet to learn something in a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.landcover.prediction.inputs import pixels, write_image, write_model
from tiling.synthetic.scenes import SynthConfig, SynthResult, synthesize_scenes
from tiling.tiler.tile import TileConfig, tile

TINY_SCENE_PX = 448
TINY_CHIP_PX = 64


@pytest.fixture(scope="session")
def tiny_scenes(tmp_path_factory: pytest.TempPathFactory) -> SynthResult:
    out = tmp_path_factory.mktemp("tiny-scenes")
    return synthesize_scenes(SynthConfig(out_dir=out, scenes=2, size_px=TINY_SCENE_PX, seed=0))


@pytest.fixture(scope="session")
def tiny_store(tiny_scenes: SynthResult, tmp_path_factory: pytest.TempPathFactory) -> str:
    """URL (a local path) of a chip store with 64 px chips and a 25 % spatial val split."""
    url = str(tmp_path_factory.mktemp("tiny-store") / "chips.zarr")
    tile(
        TileConfig(
            images=tuple(str(p) for p in tiny_scenes.image_paths),
            labels=tuple(str(p) for p in tiny_scenes.label_paths),
            out=url,
            chip_size=TINY_CHIP_PX,
            shard_size=16,
            val_fraction=0.25,
            workers=1,
        )
    )
    return url


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(scope="module")
def scene_and_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 75 x 90 px scene at 1 m in UTM 18N (not a multiple of the 32 px chip) and a small_unet
    model file with random weights (seed 7), for the tests that run `predict`."""
    folder = tmp_path_factory.mktemp("scene-and-model")
    return (
        write_image(folder / "scene.tif", pixels(75, 90, seed=1)),
        write_model(folder / "model.pt", seed=7),
    )
