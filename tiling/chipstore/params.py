"""What decides a chip store's content, and the empty arrays it implies.

`StoreParams` is recorded in the store; a resume must match it exactly (`differences` says
what changed). `create_arrays` lays out the zarr arrays: one chunk per chip, shard objects
of `shard_size` chips, zstd then crc32c on every chunk.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zarr
import zarr.codecs

from tiling.chipstore.records import NUM_BANDS
from tiling.chipstore.split import SplitRule
from tiling.chipstore.store_format import INDEX_COLUMNS
from tiling.sources.classes import ClassMap

ARRAY_NAMES = ("images", "labels", "index")


@dataclass(frozen=True, slots=True)
class StoreParams:
    """Everything that decides a store's content; a resume must match it exactly."""

    chip_size: int
    stride: int
    shard_size: int
    class_map: ClassMap | None  # None: images-only store
    val_fraction: float
    min_valid: float
    split_block_chips: int
    compression_level: int
    images: tuple[str, ...]
    labels: tuple[str, ...]
    split: SplitRule | None = None  # None: val_fraction 0 / unplanned writer tests
    zero_is_nodata: bool = True

    @property
    def has_labels(self) -> bool:
        return self.class_map is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "chip_size": self.chip_size,
            "stride": self.stride,
            "shard_size": self.shard_size,
            "class_map": self.class_map.name if self.class_map else None,
            "val_fraction": self.val_fraction,
            "min_valid": self.min_valid,
            "split_block_chips": self.split_block_chips,
            "compression_level": self.compression_level,
            "images": list(self.images),
            "labels": list(self.labels),
            "split": self.split.to_json() if self.split else None,
            "zero_is_nodata": self.zero_is_nodata,
        }

    def digest(self) -> str:
        """SHA-256 of `to_json()` (inputs included): what the group attribute keeps, since the
        list of inputs grows with the store and the attribute is rewritten per source."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


def differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The options that differ between a stored `StoreParams.to_json()` and a wanted one, each
    with both values: `chip_size 64 (now 80)`, `images differ (now with c.tif, without b.tif)`."""
    out = []
    # mappings last: the split rule is derived from the options named before it
    keys = sorted(set(stored) | set(wanted), key=lambda k: (isinstance(stored.get(k), dict), k))
    for key in keys:
        a, b = stored.get(key), wanted.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            out.append(f"{key} differ ({_list_change(a, b)})")
        elif isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
            out.append(f"{key} differ")
        else:
            out.append(f"{key} {a} (now {b})")
    return out


def _list_change(stored: list[Any], wanted: list[Any]) -> str:
    """What a list of inputs gains and loses: `now with c.tif (and 2 more), without b.tif`."""
    parts = []
    for word, items in (
        ("with", [x for x in wanted if x not in stored]),
        ("without", [x for x in stored if x not in wanted]),
    ):
        if items:
            more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
            parts.append(f"{word} {items[0]}{more}")
    return "now " + ", ".join(parts) if parts else "in another order"


def create_arrays(group: zarr.Group, params: StoreParams) -> None:
    """The empty arrays of a store (also used for scratch copies that re-encode a shard)."""
    c, s = params.chip_size, params.shard_size
    # crc32c after zstd: a flipped byte fails the chunk's checksum instead of decoding to
    # other pixels (zarr's own reads check it as well).
    compressors = (zarr.codecs.ZstdCodec(level=params.compression_level), zarr.codecs.Crc32cCodec())
    group.create_array(
        "images",
        shape=(0, NUM_BANDS, c, c),
        chunks=(1, NUM_BANDS, c, c),
        shards=(s, NUM_BANDS, c, c),
        dtype="uint8",
        compressors=compressors,
        fill_value=0,
        dimension_names=("chip", "band", "y", "x"),
        overwrite=True,
    )
    if params.has_labels:
        group.create_array(
            "labels",
            shape=(0, c, c),
            chunks=(1, c, c),
            shards=(s, c, c),
            dtype="uint8",
            compressors=compressors,
            fill_value=0,
            dimension_names=("chip", "y", "x"),
            overwrite=True,
        )
    group.create_array(
        "index",
        shape=(0, len(INDEX_COLUMNS)),
        chunks=(s, len(INDEX_COLUMNS)),
        dtype="int32",
        compressors=compressors,
        fill_value=0,
        dimension_names=("chip", "column"),
        overwrite=True,
    )
