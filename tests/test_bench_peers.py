"""The peers benchmark's own arithmetic (benchmarks/bench_peers.py), without the peers: which
pixels count as near a window edge, and the module every peer is handed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from tiling.sources.classes import get_class_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_peers import EDGE_PX, SameWeights, near_window_edges  # type: ignore[import-not-found]


def test_seam_pixels_are_those_near_interior_window_edges() -> None:
    # two windows side by side on a 40 x 70 scene: one interior edge at column 32
    near = near_window_edges((40, 70), [(0, 0, 40, 32), (0, 32, 40, 38)])
    columns = np.flatnonzero(near.any(axis=0))
    assert (columns.min(), columns.max()) == (32 - EDGE_PX, 32 + EDGE_PX - 1)
    assert near[:, 32 - EDGE_PX : 32 + EDGE_PX].all()  # every row: the edge runs top to bottom
    assert not near[:, : 32 - EDGE_PX].any() and not near[:, 32 + EDGE_PX :].any()
    # a window flush with the scene's border has no seam there
    assert not near_window_edges((40, 70), [(0, 0, 40, 70)]).any()


def test_every_peer_gets_the_same_logits_and_never_class_0(tmp_path: Path) -> None:
    torch.manual_seed(0)
    class_map = get_class_map("chesapeake7to5")
    meta = ModelMeta(
        "small_unet", class_map, ("red", "green", "blue", "nir"), (100.0,) * 4, (50.0,) * 4,
        chip_size=32, resolution_m=1.0,
    )  # fmt: skip
    path = tmp_path / "m.pt"
    save_model_file(path, build_model("small_unet", num_classes=class_map.num_classes), meta)
    pixels = torch.randint(1, 256, (1, 4, 32, 32)).float()
    with torch.inference_mode():
        raw = SameWeights(str(path), scale=1.0).eval()(pixels.clone())
        scaled = SameWeights(str(path), scale=255.0).eval()(pixels / 255.0)
    torch.testing.assert_close(raw, scaled, rtol=1e-4, atol=1e-4)
    assert (raw.argmax(1) > 0).all()
