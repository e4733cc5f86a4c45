"""A `tile` rerun into an interrupted store resumes it: what the rerun may change, and the
options that decide the chips, each refused in one line naming it and both values."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.chipstores import config, interrupt_after_first_source
from tests.tiling.rasters import Scenes
from tiling.chipstore.params import differences
from tiling.chipstore.resume import TILE_RERUN_MAY_CHANGE, TILE_RERUN_MUST_MATCH
from tiling.chipstore.store import open_store
from tiling.errors import StoreExistsError
from tiling.tiler.tile import TileConfig, tile

FIX = (
    "rerun the original command to resume it, or pass --overwrite to replace it, or choose "
    "another --out"
)


def base_config(scenes: Scenes, out: Path) -> TileConfig:
    """Both images with their labels, an identity class table (so --num-classes applies)."""
    labels = tuple(str(p) for p in scenes.chesapeake)
    return config(scenes.images, out, labels=labels, class_map="identity", num_classes=16)


@pytest.fixture(scope="module")
def interrupted(scenes: Scenes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of `base_config` whose run was killed after its first source."""
    out = tmp_path_factory.mktemp("interrupted") / "chips.zarr"
    with pytest.MonkeyPatch.context() as monkeypatch:
        interrupt_after_first_source(base_config(scenes, out), monkeypatch)
    return out


def test_every_tile_option_is_one_a_rerun_may_change_or_one_it_must_keep() -> None:
    """A new TileConfig field fails here until it is put in one of the two."""
    names = sorted(f.name for f in fields(TileConfig))
    assert sorted(TILE_RERUN_MAY_CHANGE + TILE_RERUN_MUST_MATCH) == names


# Each TileConfig field changed on a rerun, and the refusal's words (None: the rerun resumes).
CHANGES: dict[str, Callable[[Scenes, Path], tuple[dict[str, Any], str | None]]] = {
    "images": lambda s, out: (
        {"images": (str(s.images[0]),)},
        f"images differ (now without {s.images[1]})",
    ),
    "out": lambda s, out: ({"out": str(out.parent / "moved.zarr")}, None),
    "labels": lambda s, out: (
        {"labels": (str(s.chesapeake[0]), str(s.nlcd))},
        f"labels differ (now with {s.nlcd}, without {s.chesapeake[1]})",
    ),
    "chip_size": lambda s, out: ({"chip_size": 32}, "chip_size 64 (now 32)"),
    "stride": lambda s, out: ({"stride": 32}, "stride 64 (now 32)"),
    "shard_size": lambda s, out: ({"shard_size": 8}, "shard_size 4 (now 8)"),
    "min_valid": lambda s, out: ({"min_valid": 0.5}, "min_valid 0.0 (now 0.5)"),
    "class_map": lambda s, out: (
        {"class_map": "chesapeake7to5", "num_classes": None},
        "class_map identity (now chesapeake7to5)",
    ),
    "num_classes": lambda s, out: ({"num_classes": 17}, "num_classes 16 (now 17)"),
    "val_fraction": lambda s, out: ({"val_fraction": 0.25}, "val_fraction 0.1 (now 0.25)"),
    "split_block_chips": lambda s, out: ({"split_block_chips": 2}, "split_block_chips 4 (now 2)"),
    "workers": lambda s, out: ({"workers": 1}, None),
    # credentials never change the chips; local paths take none (a remote store's test would
    # pass new ones here)
    "storage_options": lambda s, out: ({}, None),
    "overwrite": lambda s, out: ({"overwrite": True}, None),
    "compression_level": lambda s, out: ({"compression_level": 5}, "compression_level 3 (now 5)"),
    "zero_is_nodata": lambda s, out: ({"zero_is_nodata": False}, "zero_is_nodata True (now False)"),
}


@pytest.mark.parametrize("name", [f.name for f in fields(TileConfig)])
def test_a_rerun_refuses_or_takes_each_changed_tile_option(
    name: str, scenes: Scenes, interrupted: Path, tmp_path: Path
) -> None:
    assert name in CHANGES, f"say what a tile rerun with another {name} does"
    out = tmp_path / "chips.zarr"
    shutil.copytree(interrupted, out)
    change, words = CHANGES[name](scenes, out)
    if "out" in change:
        shutil.move(out, change["out"])
    rerun = replace(base_config(scenes, out), **change)
    if words is None:
        assert name in TILE_RERUN_MAY_CHANGE
        assert tile(rerun).summary.complete
        return
    assert name in TILE_RERUN_MUST_MATCH
    before = open_store(str(out)).summary
    with pytest.raises(StoreExistsError) as info:
        tile(rerun)
    message = str(info.value)
    assert message.startswith(f"{out} exists and was written with other options ({words}")
    assert message.endswith(FIX) and "\n" not in message
    assert open_store(str(out)).summary == before  # untouched


def test_list_differences_name_what_was_added_and_removed() -> None:
    stored = {"images": ["a.tif", "b.tif", "c.tif"], "split": {"seed": 1}}
    wanted = {"images": ["a.tif", "d.tif", "e.tif"], "split": {"seed": 2}}
    assert differences(stored, wanted) == [
        "images differ (now with d.tif (and 1 more), without b.tif (and 1 more))",
        "split differ",
    ]
    assert differences({"images": ["a", "b"]}, {"images": ["b", "a"]}) == [
        "images differ (in another order)"
    ]
