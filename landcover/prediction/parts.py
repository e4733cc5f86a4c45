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
removes the staging area. Ranks share nothing but these files: this is the staged-parts
protocol (`tiling.staged`; docs/CONTRACTS.md, "Staged parts"), the same on local disk,
NFS-style shared paths and blob storage.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from landcover.outputs import output_errors
from landcover.prediction.ranks import RankShare
from tiling.runtime.fingerprint import Fingerprint
from tiling.staged import (
    StagedFolder,
    check_format,
    content_key,
    files_intact,
    publish_record,
    read_record,
    record_header,
    staging_url,
)

logger = logging.getLogger(__name__)

PART_FORMAT = "landcover-predict-part"
PART_VERSION = 1
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
        return record_header(PART_FORMAT, PART_VERSION) | {
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
        check_format(obj, PART_FORMAT, PART_VERSION)
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
    content = record_header(PART_FORMAT, PART_VERSION) | {
        "settings": settings,
        "model": model.to_json(),
        "images": [[path, fp.to_json()] for path, fp in images],
        "rows": [share.row0, share.row1],
        "rank": share.rank,
        "world_size": world_size,
    }
    return content_key(content)


class Staging(StagedFolder):
    """`<out>.parts/` beside the output `out` (a local path or a URL): the staged-parts
    protocol's folder (`tiling.staged`), with the names and records of prediction parts."""

    def __init__(self, out: str, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(staging_url(out), storage_options)  # every stage stages beside its output

    def name(self, rank: int, world_size: int, key: str, kind: str) -> str:
        stem = f"part-{rank:05d}-of-{world_size:05d}.{key}"
        return f"{stem}.json" if kind == RECORD else f"{stem}.{_SUFFIX[kind]}"

    def publish(self, local_file: str, name: str) -> None:
        """Put a finished local file at `name`: fsynced and renamed (local), or one upload."""
        with output_errors():
            self.put_file(local_file, name)

    def write_record(self, record: PartRecord) -> None:
        """Commit a part: its record, written atomically after its files."""
        name = self.name(record.rank, record.world_size, record.key, RECORD)
        with output_errors():
            publish_record(self, name, record.to_json())

    def read_record(self, rank: int, world_size: int, key: str) -> PartRecord | None:
        """The committed record of rank's part with this key, or None: not there (yet), or
        not to be trusted (unreadable, another rank's or key's, files of other sizes)."""
        name = self.name(rank, world_size, key, RECORD)
        record = read_record(self, name, PartRecord.from_json)
        if record is None:
            return None
        if (record.rank, record.world_size, record.key) != (rank, world_size, key):
            logger.warning("ignoring %s: it records another part", self.path(name))
            return None
        files = {self.name(rank, world_size, key, k): size for k, size in record.file_bytes.items()}
        return record if files_intact(self, name, files) else None


class PartWriter:
    """One rank's part being written: local temporary files for the tiled GeoTIFFs
    (`tiles_out`, `tiles_prob`); `commit` publishes them, then the record. Leaving the
    `with` block removes what was not published."""

    def __init__(
        self, staging: Staging, share: RankShare, world_size: int, key: str, *, probabilities: bool
    ) -> None:
        self.staging, self.share, self.world_size, self.key = staging, share, world_size, key
        self._scratch = ExitStack()
        self.scratch = self._scratch.enter_context(staging.scratch())
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
        self._scratch.close()

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
