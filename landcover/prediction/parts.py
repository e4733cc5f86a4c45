"""The staging area of a distributed prediction: each rank's part, named by what it depends
on and committed by a record written after its files.

Every rank writes the rows it predicted (`landcover.prediction.ranks`) into a tiled GeoTIFF
of just those rows (and one for the probabilities when asked) under `<out>.parts/`, beside the
output: a local or shared directory, or the same prefix on az://. A part's name carries its
rank, the world size and a KEY, a hash of everything its pixels depend on (the model file's
and the images' fingerprints, the grid, the region, the options that change pixels, the
rows). A part is committed by its RECORD (`part-R-of-W.KEY.json`: rows, windows run, class
tally, file sizes), written only after its files are in place (renamed within the directory,
or uploaded whole), so:

- a half-written part has no record and is never read (its temporary files are ignored);
- a part left by another run (other inputs, model, options or world size) has another key,
  so its name is never asked for;
- a rerun of the same job finds its finished parts under the same names and keeps them
  (resume) once their files still have the recorded sizes.

Rank 0 waits for every rank's record, assembles (`landcover.prediction.assemble`), then
removes the staging area. Ranks share nothing but these files: the same protocol works on
local disk, NFS-style shared paths and blob storage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.atomic import write_text_atomic
from landcover.prediction.ranks import RankShare
from tiling.fingerprint import Fingerprint
from tiling.staging import staging_url
from tiling.urls import filesystem, is_local, storage_errors

logger = logging.getLogger(__name__)

PART_FORMAT = "landcover-predict-part"
PART_VERSION = 1
KEY_HEX = 24  # 96 bits of the key's SHA-256 in names: no collision between runs
CLASSES, PROBABILITIES, RECORD = "classes", "probabilities", "record"
_SUFFIX = {CLASSES: "tif", PROBABILITIES: "prob.tif"}


@dataclass(frozen=True, slots=True)
class PartRecord:
    """The record that commits one rank's part (written after the part's files)."""

    rank: int
    world_size: int
    key: str
    row0: int
    row1: int
    windows: int
    class_pixels: tuple[int, ...]
    file_bytes: Mapping[str, int]  # CLASSES / PROBABILITIES -> size; empty for no rows

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PART_FORMAT,
            "version": PART_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "key": self.key,
            "row0": self.row0,
            "row1": self.row1,
            "windows": self.windows,
            "class_pixels": list(self.class_pixels),
            "file_bytes": dict(self.file_bytes),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PartRecord:
        if obj.get("format") != PART_FORMAT or obj.get("version") != PART_VERSION:
            raise ValueError(f"not a {PART_FORMAT} record of version {PART_VERSION}")
        return cls(
            rank=int(obj["rank"]),
            world_size=int(obj["world_size"]),
            key=str(obj["key"]),
            row0=int(obj["row0"]),
            row1=int(obj["row1"]),
            windows=int(obj["windows"]),
            class_pixels=tuple(int(v) for v in obj["class_pixels"]),
            file_bytes=_file_bytes(obj["file_bytes"]),
        )


def _file_bytes(obj: Mapping[str, Any]) -> dict[str, int]:
    sizes = {str(k): int(v) for k, v in dict(obj).items()}
    unknown = sorted(set(sizes) - set(_SUFFIX))
    if unknown:
        raise ValueError(f"unknown part file kind {unknown[0]!r}")
    return sizes


def part_key(
    settings: Mapping[str, Any],
    model: Fingerprint,
    images: Sequence[tuple[str, Fingerprint]],
    share: RankShare,
    world_size: int,
) -> str:
    """The hash naming a rank's part: `settings` (JSON values: grid, region, options), the
    model's and the read images' fingerprints (in reading order), the rows and world size."""
    content = {
        "format": PART_FORMAT,
        "version": PART_VERSION,
        "settings": settings,
        "model": model.to_json(),
        "images": [[path, fp.to_json()] for path, fp in images],
        "rows": [share.row0, share.row1],
        "rank": share.rank,
        "world_size": world_size,
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX]


class Staging:
    """`<out>.parts/` beside the output `out` (a local path or a URL)."""

    def __init__(self, out: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = staging_url(out)  # tiling's naming: every stage stages beside its output
        self.local = is_local(out)
        self.fs, self.root = filesystem(self.url, storage_options)

    def name(self, rank: int, world_size: int, key: str, kind: str) -> str:
        stem = f"part-{rank:05d}-of-{world_size:05d}.{key}"
        return f"{stem}.json" if kind == RECORD else f"{stem}.{_SUFFIX[kind]}"

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def scratch(self) -> str:
        """A local directory for files being written: the staging directory itself when
        local (a rename there is atomic), else a new temporary directory."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            return self.root
        return tempfile.mkdtemp(prefix="landcover-part-")

    def publish(self, local_file: str, name: str) -> None:
        """Put a finished local file at `name`: a rename (local) or one whole upload."""
        if self.local:
            # On disk before the rename: a record that survives a crash has whole files.
            fd = os.open(local_file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(local_file, self.path(name))
            return
        with storage_errors(self.url):
            self.fs.put_file(local_file, self.path(name))

    def write_record(self, record: PartRecord) -> None:
        """Commit a part: its record, written atomically after its files."""
        name = self.name(record.rank, record.world_size, record.key, RECORD)
        text = json.dumps(record.to_json(), indent=1)
        if self.local:
            write_text_atomic(self.path(name), text)
            return
        with storage_errors(self.url):
            self.fs.pipe_file(self.path(name), text.encode())

    def names(self) -> set[str]:
        """The names in the staging area now (one listing, not cached)."""
        with storage_errors(self.url):
            if self.local:
                return set(os.listdir(self.root)) if os.path.isdir(self.root) else set()
            self.fs.invalidate_cache(self.root)
            if not self.fs.exists(self.root):
                return set()
            return {
                str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)
            }

    def read_record(self, rank: int, world_size: int, key: str) -> PartRecord | None:
        """The committed record of rank's part with this key, or None: not there (yet), or
        not to be trusted (unreadable, another rank's or key's, files of other sizes)."""
        path = self.path(self.name(rank, world_size, key, RECORD))
        try:
            with storage_errors(self.url):
                if not self.local:
                    self.fs.invalidate_cache(self.root)  # listings are cached; ask again
                text = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        try:
            record = PartRecord.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring %s: unreadable record (%s)", path, exc)
            return None
        if (record.rank, record.world_size, record.key) != (rank, world_size, key):
            logger.warning("ignoring %s: it records another part", path)
            return None
        for kind, size in record.file_bytes.items():
            file = self.path(self.name(rank, world_size, key, kind))
            with storage_errors(self.url):
                actual = self.fs.size(file) if self.fs.exists(file) else None
            if actual != size:
                logger.warning("ignoring %s: %s has %s bytes, not %d", path, file, actual, size)
                return None
        return record

    def fetch(self, name: str, into: str) -> str:
        """A local path of file `name`: the file itself when local, else a download."""
        if self.local:
            return self.path(name)
        target = str(Path(into) / name)
        with storage_errors(self.url):
            self.fs.get_file(self.path(name), target)
        return target

    def remove(self) -> None:
        """Delete the staging area and everything in it (other runs' leftovers too)."""
        if self.local:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        with storage_errors(self.url):
            self.fs.invalidate_cache(self.root)
            if self.fs.exists(self.root):
                self.fs.rm(self.root, recursive=True)


class PartWriter:
    """One rank's part being written: local temporary files for the tiled GeoTIFFs
    (`tiles_out`, `tiles_prob`); `commit` publishes them, then the record. Leaving the
    `with` block removes what was not published."""

    def __init__(
        self, staging: Staging, share: RankShare, world_size: int, key: str, *, probabilities: bool
    ) -> None:
        self.staging, self.share, self.world_size, self.key = staging, share, world_size, key
        self.scratch = staging.scratch()
        token = uuid.uuid4().hex[:8]
        self.files = {CLASSES: self._temp(CLASSES, token)}
        if probabilities:
            self.files[PROBABILITIES] = self._temp(PROBABILITIES, token)

    @property
    def tiles_out(self) -> str:
        return self.files[CLASSES]

    @property
    def tiles_prob(self) -> str | None:
        return self.files.get(PROBABILITIES)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for path in self.files.values():
            Path(path).unlink(missing_ok=True)
            Path(path + ".aux.xml").unlink(missing_ok=True)
        if not self.staging.local:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def commit(
        self, windows: int, class_pixels: Sequence[int] | npt.NDArray[np.int64]
    ) -> PartRecord:
        """Publish the part's files (none for a share without rows), then its record."""
        sizes: dict[str, int] = {}
        if not self.share.is_empty:
            for kind, path in self.files.items():
                sizes[kind] = os.path.getsize(path)
                self.staging.publish(path, self._name(kind))
        record = PartRecord(
            rank=self.share.rank,
            world_size=self.world_size,
            key=self.key,
            row0=self.share.row0,
            row1=self.share.row1,
            windows=windows,
            class_pixels=tuple(int(v) for v in class_pixels),
            file_bytes=sizes,
        )
        self.staging.write_record(record)
        return record

    def _name(self, kind: str) -> str:
        return self.staging.name(self.share.rank, self.world_size, self.key, kind)

    def _temp(self, kind: str, token: str) -> str:
        # A dot name that no reader asks for; GDAL is told the driver, not the extension.
        return str(Path(self.scratch) / f".{self._name(kind)}.{token}.tmp")
