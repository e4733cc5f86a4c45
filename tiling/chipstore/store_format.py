"""The chip-store format: its name and version, the split codes, the index columns, and the
`landcover_chips` group attribute read into a `StoreSummary`.

A chip store is one Zarr v3 group at any fsspec URL (see docs/CONTRACTS.md):

- `images` (N, 4, C, C) uint8 and `labels` (N, C, C) uint8, one chunk per chip, grouped by the
  sharding codec into shard objects of `shard_size` chips: a rank's one-time load is a few
  large sequential reads, not N small ones (blob storage charges per request).
- `index` (N, 4) int32: source id, row/col of the chip in its source (pixels), split.
- `sources` (S,) variable-length UTF-8: one JSON record per done source
  (`tiling.chipstore.source_table`).
- group attribute `landcover_chips`: format, version, the parameters' digest, band stats,
  class counts and `source_chips`, the chips of each done source as one string of decimal
  numbers separated by spaces (`done_chips`). Counting a source there is the commit point:
  the arrays may be longer than the sum of done sources (spare capacity, a source being
  appended, or the half-written tail of an interrupted run) and readers never look past the
  done prefix.

Format versions: 2 adds a crc32c to every chunk, stored-chunk counts per shard object,
source fingerprints, the ground-grid split and the zero-fill nodata rule. 3 moves the source
records out of the group attribute into the `sources` array, so that committing a source
costs the same at the 4,000th source as at the first. Version 1 and 2 stores are still read
(version 1 with one warning that its integrity cannot be checked); `tile` does not resume
them (--overwrite rebuilds).

Reading is `tiling.chipstore.store`, writing `tiling.chipstore.writer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import zarr

from tiling.chipstore.records import BANDS, NUM_BANDS, BandStats, SourceRecord
from tiling.errors import StoreError
from tiling.sources.classes import ClassMap

__all__ = [
    "ATTRS_KEY",
    "FIRST_CHECKED_VERSION",
    "FIRST_TABLE_VERSION",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_COLUMNS",
    "SPLIT_CODES",
    "SPLIT_TRAIN",
    "SPLIT_VAL",
    "Split",
    "StoreSummary",
    "array",
    "chip_store_meta",
    "done_chips",
    "done_prefix",
    "store_meta",
    "summary_from_meta",
]

FORMAT_NAME = "landcover-chips"
FORMAT_VERSION = 3
FIRST_CHECKED_VERSION = 2  # chunk checksums and stored-chunk counts from here on
FIRST_TABLE_VERSION = 3  # source records in the `sources` array, not in the attribute
ATTRS_KEY = "landcover_chips"
SPLIT_TRAIN = 0
SPLIT_VAL = 1
SPLIT_CODES: dict[str, int] = {"train": SPLIT_TRAIN, "val": SPLIT_VAL}
INDEX_COLUMNS: tuple[str, ...] = ("source_id", "row_px", "col_px", "split")

Split = Literal["train", "val", "all"]


@dataclass(frozen=True, slots=True)
class StoreSummary:
    """What a reader needs to know about a store; counts cover done sources only."""

    chip_size: int
    stride: int
    shard_size: int
    bands: tuple[str, ...]
    class_map: ClassMap | None
    band_mean: tuple[float, ...]
    band_std: tuple[float, ...]
    band_stats: BandStats
    class_counts: tuple[int, ...]
    resolution_m: float | None
    num_chips: int
    num_train: int
    num_val: int
    has_labels: bool
    sources: tuple[SourceRecord, ...]  # done sources, in input order
    format_version: int
    val_fraction: float
    min_valid: float
    complete: bool  # every planned source is done
    split_block_m: float | None = None  # edge of the ground-grid split blocks (version 2 on)

    @property
    def integrity_checked(self) -> bool:
        """Whether reads can check checksums and detect lost shard objects (version 2 on)."""
        return self.format_version >= FIRST_CHECKED_VERSION

    @property
    def chip_bytes(self) -> int:
        """Raw (decoded) bytes of one chip: image plus label."""
        c2 = self.chip_size * self.chip_size
        return NUM_BANDS * c2 + (c2 if self.has_labels else 0)

    def count(self, split: Split) -> int:
        if split == "all":
            return self.num_chips
        return self.num_train if split == "train" else self.num_val


def chip_store_meta(attrs: Mapping[str, Any]) -> tuple[Mapping[str, Any], int] | None:
    """The `landcover_chips` attribute of a group's `attrs` and the chip store format version
    it states; None when the group is no landcover chip store."""
    meta = attrs.get(ATTRS_KEY)
    if not isinstance(meta, Mapping) or meta.get("format") != FORMAT_NAME:
        return None
    return meta, int(meta.get("version", 0))


def store_meta(attrs: Mapping[str, Any], *, url: str) -> Mapping[str, Any]:
    """The `landcover_chips` attribute; `StoreError` for anything but a chip store this
    landcover reads."""
    found = chip_store_meta(attrs)
    if found is None:
        raise StoreError(
            f"{url}: not a landcover chip store (no {ATTRS_KEY!r} attribute); "
            "write one with `landcover tile`"
        )
    meta, version = found
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{url}: chip store format version {version} is newer than this landcover "
            f"reads (version {FORMAT_VERSION}); upgrade landcover"
        )
    return meta


def summary_from_meta(meta: Mapping[str, Any], sources: Sequence[SourceRecord]) -> StoreSummary:
    """The reader's summary of a store from its attribute and its done sources, in input
    order (`tiling.chipstore.source_table.read_summary` reads both)."""
    version = int(meta.get("version", 0))
    done = tuple(sources)
    stats = sum((s.band_stats for s in done), BandStats())
    class_map_json = meta.get("class_map")
    class_map = ClassMap.from_json(class_map_json) if class_map_json else None
    num_classes = class_map.num_classes if class_map else 0
    class_counts = [0] * num_classes
    for s in done:
        for code, n in enumerate(s.class_counts[:num_classes]):
            class_counts[code] += n
    resolutions = sorted(s.resolution_m for s in done)
    split = meta.get("split")
    return StoreSummary(
        chip_size=int(meta["chip_size"]),
        stride=int(meta["stride"]),
        shard_size=int(meta["shard_size"]),
        bands=tuple(meta.get("bands", BANDS)),
        class_map=class_map,
        band_mean=stats.mean,
        band_std=stats.std,
        band_stats=stats,
        class_counts=tuple(class_counts),
        resolution_m=resolutions[len(resolutions) // 2] if resolutions else None,
        num_chips=sum(s.chips for s in done),
        num_train=sum(s.train_chips for s in done),
        num_val=sum(s.val_chips for s in done),
        has_labels=bool(meta.get("has_labels", class_map is not None)),
        sources=done,
        format_version=version,
        val_fraction=float(meta.get("val_fraction", 0.0)),
        min_valid=float(meta.get("min_valid", 0.0)),
        complete=bool(meta.get("complete", False)),
        split_block_m=float(split["block_m"]) if isinstance(split, Mapping) else None,
    )


def array(group: zarr.Group, name: str, url: str) -> zarr.Array[Any]:
    """The array `name` of the store's group; `StoreError` if it is missing."""
    try:
        node = group[name]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise StoreError(
            f"{url}: chip store has no {name!r} array; rebuild it with `landcover tile`"
        )
    return node


def done_chips(meta: Mapping[str, Any]) -> list[int]:
    """The chips of each done source of a format 3 store, from its group attribute.

    One string ("675 681 0 ..."), not a JSON list: zarr encodes a list element by element
    and the attribute is rewritten per source, so a list's cost per commit grows with the
    number of sources far faster than one string's (`benchmarks/bench_store_records.py`).
    """
    text = meta.get("source_chips", "")
    if not isinstance(text, str):
        raise StoreError(f"source_chips is {type(text).__name__}, not a string")
    try:
        return [int(chips) for chips in text.split()]
    except ValueError:
        raise StoreError(f"source_chips is not a list of numbers: {text[:40]!r}") from None


def done_prefix(sources: Sequence[SourceRecord]) -> tuple[SourceRecord, ...]:
    """The done sources that precede the first unfinished one: what readers may see."""
    done: list[SourceRecord] = []
    for s in sources:
        if not s.done:
            break
        done.append(s)
    return tuple(done)
