"""Where a tiled map product lives and how a finished tile is committed.

A product is a directory: a local path or an az:// prefix (`ProductDir`). A tile's COG is
put there whole (a rename, or one upload), then its RECORD `records/<name>.json`: the key
(a hash of everything the tile's pixels depend on), the tile's rectangle, windows run, class
tally, the COG's size and its STAC item. A tile counts as done only when its record has the
key this run asks for and its COG the recorded size, so a tile half-written, deleted, or
made from other inputs or options is never trusted (docs/CONTRACTS.md, "Tiled map product").
This is the staged-parts protocol (`tiling.staged`; docs/CONTRACTS.md, "Staged parts") with
the product directory as the staging folder: a tile is a part that stays where it is put.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from landcover.outputs import output_errors
from landcover.prediction.gridwindow import Window
from tiling.runtime.fingerprint import Fingerprint
from tiling.staged.folder import StagedFolder
from tiling.staged.keys import content_key
from tiling.staged.record import (
    check_format,
    files_intact,
    publish_record,
    read_record,
    record_header,
)

TILE_FORMAT = "landcover-map-tile"
TILE_VERSION = 1
RECORDS_DIR = "records"
TAG_PRODUCT = "LANDCOVER_PRODUCT"  # band 1 tag of each tile COG: the key of its product


@dataclass(frozen=True, slots=True)
class TileRecord:
    """The record that commits one tile (written after the tile's COG)."""

    name: str
    key: str
    rect: Window  # the tile's pixels of the output grid
    windows: int
    class_pixels: tuple[int, ...]
    file_bytes: int
    item: Mapping[str, Any]  # the tile's STAC item (pystac's dict), hrefs relative; {}: none

    @property
    def has_data(self) -> bool:
        """Whether the tile has a pixel with data, and so a COG and an item; a tile without
        one is committed by its record alone (the mosaic reads nodata there)."""
        return bool(self.item)

    def to_json(self) -> dict[str, Any]:
        return record_header(TILE_FORMAT, TILE_VERSION) | {
            "name": self.name,
            "key": self.key,
            "rect": list(self.rect),
            "windows": self.windows,
            "class_pixels": list(self.class_pixels),
            "file_bytes": self.file_bytes,
            "item": dict(self.item),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TileRecord:
        check_format(obj, TILE_FORMAT, TILE_VERSION)
        row, col, height, width = (int(v) for v in obj["rect"])
        return cls(
            name=str(obj["name"]),
            key=str(obj["key"]),
            rect=Window(row, col, height, width),
            windows=int(obj["windows"]),
            class_pixels=tuple(int(v) for v in obj["class_pixels"]),
            file_bytes=int(obj["file_bytes"]),
            item=dict(obj["item"]),
        )


def tile_key(
    settings: Mapping[str, Any],
    tile_px: int,
    rect: Window,
    model: Fingerprint,
    images: Sequence[tuple[str, Fingerprint]],
) -> str:
    """The hash of what a tile's pixels depend on: `settings` (JSON values: grid, region,
    options), the tile size and rectangle, the model's and the read images' fingerprints."""
    content = record_header(TILE_FORMAT, TILE_VERSION) | {
        "settings": settings,
        "tile_px": tile_px,
        "rect": list(rect),
        "model": model.to_json(),
        "images": [[path, fp.to_json()] for path, fp in images],
    }
    return content_key(content)


class ProductDir(StagedFolder):
    """The directory of a tiled product (a local path or a URL; `url` ends with "/"): the
    staging folder of its tiles, which stay there. Names are relative to it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        self.url = self.url + "/"  # a directory: names are appended to it in messages

    def record_name(self, name: str) -> str:
        """Where tile `name`'s record is, relative to the directory."""
        return f"{RECORDS_DIR}/{name}.json"

    def read_record(self, name: str) -> TileRecord | None:
        """Tile `name`'s record, or None: none, or unreadable."""
        record = read_record(self, self.record_name(name), TileRecord.from_json)
        return record if record is not None and record.name == name else None

    def committed(self, record: TileRecord | None, key: str) -> bool:
        """Whether `record` commits its tile for this run: it has `key`, and its COG (if
        the tile has data) the recorded size."""
        if record is None or record.key != key:
            return False
        files = {f"{record.name}.tif": record.file_bytes} if record.has_data else {}
        return files_intact(self, self.record_name(record.name), files)

    def put_file(self, local_file: str, name: str) -> None:
        """Put a finished local file at `name`: fsynced and renamed (local), or one upload."""
        with output_errors():
            super().put_file(local_file, name)

    def commit(self, record: TileRecord) -> None:
        """Commit a tile: its record, after its COG is in place."""
        with output_errors():
            publish_record(self, self.record_name(record.name), record.to_json())
