"""Where a tiled map product lives and how a finished tile is committed.

A product is a directory: a local path or an az:// prefix (`ProductDir`). A tile's COG is
put there whole (a rename, or one upload), then its RECORD `records/<name>.json`: the key
(a hash of everything the tile's pixels depend on), the tile's rectangle, windows run, class
tally, the COG's size and its STAC item. A tile counts as done only when its record has the
key this run asks for and its COG the recorded size, so a tile half-written, deleted, or
made from other inputs or options is never trusted (docs/CONTRACTS.md, "Tiled map product").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landcover.atomic import publish, write_text_atomic
from tiling.fingerprint import Fingerprint
from tiling.urls import filesystem, is_local, local_path, storage_errors

logger = logging.getLogger(__name__)

TILE_FORMAT = "landcover-map-tile"
TILE_VERSION = 1
RECORDS_DIR = "records"
KEY_HEX = 24  # 96 bits of the key's SHA-256: no collision between runs


@dataclass(frozen=True, slots=True)
class TileRecord:
    """The record that commits one tile (written after the tile's COG)."""

    name: str
    key: str
    rect: tuple[int, int, int, int]  # row0, col0, height, width in the output grid
    windows: int
    class_pixels: tuple[int, ...]
    file_bytes: int
    item: Mapping[str, Any]  # the tile's STAC item (pystac's dict), hrefs relative

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TILE_FORMAT,
            "version": TILE_VERSION,
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
        if obj.get("format") != TILE_FORMAT or obj.get("version") != TILE_VERSION:
            raise ValueError(f"not a {TILE_FORMAT} record of version {TILE_VERSION}")
        row0, col0, height, width = (int(v) for v in obj["rect"])
        return cls(
            name=str(obj["name"]),
            key=str(obj["key"]),
            rect=(row0, col0, height, width),
            windows=int(obj["windows"]),
            class_pixels=tuple(int(v) for v in obj["class_pixels"]),
            file_bytes=int(obj["file_bytes"]),
            item=dict(obj["item"]),
        )


def tile_key(
    settings: Mapping[str, Any],
    tile_px: int,
    rect: tuple[int, int, int, int],
    model: Fingerprint,
    images: Sequence[tuple[str, Fingerprint]],
) -> str:
    """The hash of what a tile's pixels depend on: `settings` (JSON values: grid, region,
    options), the tile size and rectangle, the model's and the read images' fingerprints."""
    content = {
        "format": TILE_FORMAT,
        "version": TILE_VERSION,
        "settings": settings,
        "tile_px": tile_px,
        "rect": list(rect),
        "model": model.to_json(),
        "images": [[path, fp.to_json()] for path, fp in images],
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX]


class ProductDir:
    """The directory of a tiled product (a local path or a URL); names are relative to it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/") + "/"
        self.local = is_local(url)
        self.storage_options = dict(storage_options or {})
        self.fs, root = filesystem(self.url.rstrip("/"), storage_options)
        self.root = str(local_path(self.url).absolute()) if self.local else root.rstrip("/")

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def names(self, under: str = "") -> set[str]:
        """The file names in the directory (or its subdirectory `under`) now."""
        folder = self.path(under) if under else self.root
        with storage_errors(self.url):
            if self.local:
                return set(os.listdir(folder)) if os.path.isdir(folder) else set()
            self.fs.invalidate_cache(folder)
            if not self.fs.exists(folder):
                return set()
            return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(folder, detail=False)}

    def size(self, name: str) -> int | None:
        """The size of file `name` in bytes, None when there is none."""
        with storage_errors(self.url):
            if self.local:
                path = self.path(name)
                return os.path.getsize(path) if os.path.isfile(path) else None
            path = self.path(name)
            return int(self.fs.size(path)) if self.fs.exists(path) else None

    def read_record(self, name: str) -> TileRecord | None:
        """Tile `name`'s record, or None: none, or unreadable."""
        path = self.path(f"{RECORDS_DIR}/{name}.json")
        try:
            with storage_errors(self.url):
                text = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            record = TileRecord.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring %s: unreadable record (%s)", path, exc)
            return None
        return record if record.name == name else None

    def put_file(self, local_file: str, name: str, *, overwrite: bool) -> None:
        """Put a finished local file at `name`: a rename (local) or one whole upload."""
        if self.local:
            target = Path(self.path(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            publish(local_file, target, overwrite=overwrite)
            return
        with storage_errors(self.url):
            self.fs.put_file(local_file, self.path(name))

    def write_text(self, name: str, text: str) -> None:
        """Write text file `name` atomically (local) or as one upload."""
        if self.local:
            Path(self.path(name)).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path(name), text)
            return
        with storage_errors(self.url):
            self.fs.pipe_file(self.path(name), text.encode())

    def fetch(self, name: str, into: str) -> str:
        """A local path of file `name`: the file itself when local, else a download."""
        if self.local:
            return self.path(name)
        target = str(Path(into) / Path(name).name)
        with storage_errors(self.url):
            self.fs.get_file(self.path(name), target)
        return target

    def commit(self, record: TileRecord) -> None:
        """Commit a tile: its record, after its COG is in place."""
        self.write_text(f"{RECORDS_DIR}/{record.name}.json", json.dumps(record.to_json(), indent=1))
