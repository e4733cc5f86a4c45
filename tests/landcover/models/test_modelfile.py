"""The model file (landcover.models.modelfile): a round trip rebuilds the same model, its
metadata reads alone, and a file that would run code when loaded is refused by every reader."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from landcover.errors import ModelFileError
from landcover.models.modelfile import (
    ModelMeta,
    load_model_file,
    read_model_file,
    read_model_meta,
    save_model_file,
)
from landcover.models.registry import build_model
from tiling.sources.classes import get_class_map


def test_save_then_load_rebuilds_the_same_model_and_metadata(tmp_path: Path) -> None:
    torch.manual_seed(0)
    class_map = get_class_map("chesapeake7to5")
    model = build_model("small_unet", in_channels=4, num_classes=len(class_map.classes))
    meta = ModelMeta(
        architecture="small_unet",
        class_map=class_map,
        band_names=("red", "green", "blue", "nir"),
        band_mean=(100.0, 101.0, 102.0, 103.0),
        band_std=(50.0, 51.0, 52.0, 53.0),
        chip_size=64,
        resolution_m=1.0,
    )
    path = tmp_path / "model.pt"
    save_model_file(path, model, meta)
    read_meta, state = read_model_file(path)
    assert read_meta == meta
    assert read_model_meta(path) == meta
    loaded, _ = load_model_file(path)
    x = torch.rand(1, 4, 40, 37)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x), rtol=0, atol=0)
    assert set(state) == set(model.state_dict())


@pytest.mark.parametrize("read", [load_model_file, read_model_meta])
def test_malicious_model_file_is_refused(read: Any, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "model.pt"
    path.write_bytes(pickle.dumps({"format": "landcover-model", "payload": Exploit()}, protocol=2))
    with pytest.raises(ModelFileError, match="refused to load"):
        read(path)
    assert not marker.exists()
