"""Chip-store helpers shared by the tiling and CLI tests: a store's objects as bytes, hand-written
sources for the writer, tile configs of the generated scenes, and stores left as an
interrupted `tile` leaves them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiling.chipstore.params import StoreParams
from tiling.chipstore.store import ATTRS_KEY, BandStats, SourceRecord
from tiling.chipstore.writer import ChipStoreWriter
from tiling.runtime.urls import filesystem
from tiling.sources.classes import get_class_map
from tiling.tiler.parts import SourcePart, SourceTotals
from tiling.tiler.tile import TileConfig, tile


def snapshot(url: str, options: Mapping[str, Any]) -> dict[str, bytes]:
    """Every object of a store, keyed by its path inside the store."""
    fs, root = filesystem(url, options)
    root = root.rstrip("/")
    return {p[len(root) + 1 :]: fs.cat_file(p) for p in sorted(fs.find(root))}


def config(images: list[Path] | tuple[Path, ...], out: Path, **kw: Any) -> TileConfig:
    """A TileConfig of `images` into `out`: 64 px chips, shards of 4, 2 workers; `kw` overrides."""
    base: dict[str, Any] = {
        "images": tuple(str(p) for p in images),
        "out": str(out),
        "chip_size": 64,
        "shard_size": 4,
        "min_valid": 0.0,
        "workers": 2,
    }
    base.update(kw)
    return TileConfig(**base)


def interrupt_after_first_source(cfg: TileConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run `tile(cfg)` as a process killed right after its first source was committed."""
    real_commit = ChipStoreWriter.commit_source

    def commit_then_crash(self: ChipStoreWriter, **kwargs: Any) -> Any:
        record = real_commit(self, **kwargs)
        raise RuntimeError(f"killed after source {record.id}")

    monkeypatch.setattr(ChipStoreWriter, "commit_source", commit_then_crash)
    with pytest.raises(RuntimeError, match="killed after source 0"):
        tile(cfg)
    monkeypatch.undo()


def small_params(images: tuple[str, ...]) -> StoreParams:
    """Store parameters of 8 px chips in shards of 5, no val split, for hand-written sources."""
    return StoreParams(
        chip_size=8,
        stride=8,
        shard_size=5,
        class_map=get_class_map("chesapeake7to5"),
        val_fraction=0.0,
        min_valid=0.0,
        split_block_chips=4,
        compression_level=3,
        images=images,
        labels=("l",),
    )


def chips(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`n` random 8 px chips: images, labels and index rows of source `seed`."""
    rng = np.random.default_rng(seed)
    images = rng.integers(1, 256, size=(n, 4, 8, 8), dtype=np.uint8)
    labels = rng.integers(0, 5, size=(n, 8, 8), dtype=np.uint8)
    index = np.stack([np.full(n, seed), np.arange(n), np.zeros(n), np.zeros(n)], 1)
    return images, labels, index.astype(np.int32)


def record(source_id: int) -> SourceRecord:
    """The record of an 80 x 80 px source about to be written."""
    return SourceRecord(
        id=source_id,
        path=f"s{source_id}",
        crs="",
        transform=(1.0, 0.0, 0.0, 0.0, -1.0, 0.0),
        shape=(80, 80),
        start=0,
        chips=0,
        state="writing",
    )


def write_source(
    writer: ChipStoreWriter, source_id: int, data: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> None:
    """Append `data` as source `source_id` and commit it."""
    writer.begin_source(record(source_id))
    writer.append(*data)
    writer.commit_source(
        band_stats=BandStats(), class_counts=(0,) * 5, train_chips=len(data[0]), val_chips=0
    )


def sample_part(key: str = "k" * 24, *, labels: bool = True) -> SourcePart:
    """A staged part of source 7 with three chips, one image and one label missing."""
    totals = SourceTotals(3, sums=[1, 2, 3, 2**70], sums_sq=[5, 6, 7, 8], valid_px=9)
    totals.class_counts, totals.train, totals.val = [0, 4, 5], 2, 1
    return SourcePart(
        source_id=7,
        key=key,
        totals=totals,
        images=[b"image-0", None, b"image-2"],
        labels=[b"l0", b"l1", None] if labels else [],
        index=[np.array([[7, 0, 0, 0], [7, 0, 64, 1]], np.int32), np.array([[7, 64, 0, 0]])],
    )


def incomplete_copy(store: str, dest: Path) -> str:
    """A copy of `store` as an interrupted tile command leaves it: its last source not done,
    the store not complete."""
    shutil.copytree(store, dest)
    meta_path = dest / "zarr.json"
    meta = json.loads(meta_path.read_text())
    chips = meta["attributes"][ATTRS_KEY]
    chips["complete"] = False
    chips["source_chips"] = chips["source_chips"].rsplit(" ", 1)[0]  # the last one's commit
    meta_path.write_text(json.dumps(meta))
    return str(dest)


def incomplete_store_error(url: str) -> str:
    """The CLI's line for the tiny store's `incomplete_copy` (its first of two sources done)."""
    return (
        f"error: {url}: the store is incomplete (tiling stopped after 1 source(s), 49 chips); "
        "rerun the same `landcover tile` command to finish it, or pass --allow-incomplete to "
        "train on the chips written so far\n"
    )
