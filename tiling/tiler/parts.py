"""Staged parts: one source's encoded chips and statistics, cut by one rank, committed by rank 0.

A part holds everything the store's single writer needs to append a source without
re-encoding it: the chunks exactly as `ChunkEncoder` made them (so the shard objects built
from them are the bytes a one-process run writes), the index rows, the band sums, class
counts and train/val counts. It is one object, written whole: on local disk and NFS under a
temporary name renamed over the final one, on blob storage as one upload (a blob is not
visible before its upload commits). Its name carries the source id and a key, a digest of
what decides its bytes (the part and store format versions, the store parameters, the
source's path, label paths and their fingerprints), and its body ends with the key again and
a crc32c of everything before it. A reader that finds a part under the expected name checks
all of that and otherwise ignores it: a half-written, damaged or foreign part is never
trusted, only redone.

Parts are kept in `tiling.tiler.staging.PartStaging`, a folder beside the store.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import google_crc32c
import numpy as np
import numpy.typing as npt

from tiling.chipstore.params import StoreParams
from tiling.chipstore.records import NUM_BANDS, BandStats
from tiling.chipstore.shards import EncodedChunk
from tiling.chipstore.store_format import FORMAT_VERSION
from tiling.runtime.fingerprint import Fingerprint
from tiling.staged.keys import content_key
from tiling.tiler.plan import SourcePlan

PART_FORMAT_VERSION = 2  # 2: a part may leave its interior shard objects beside it
_MAGIC = b"LCPART01"
_HEAD = struct.Struct("<8sQ")  # magic, header length
_TRAILER = struct.Struct("<I")  # crc32c of everything before it
_ABSENT = -1  # a chunk equal to the fill value: not stored


@dataclass(frozen=True, slots=True)
class Interior:
    """Where a source's interior shard objects are: its start row, the shard indices
    [first, end) of the objects staged for it, and how many image and label chunks each
    stores (an absent chunk, equal to the fill value, is not stored)."""

    start: int
    first: int
    end: int
    shard_size: int
    image_chunks: tuple[int, ...]
    label_chunks: tuple[int, ...]

    @property
    def shards(self) -> range:
        return range(self.first, self.end)

    @property
    def rows(self) -> int:
        """Chips held in the interior objects."""
        return (self.end - self.first) * self.shard_size

    @property
    def head(self) -> int:
        """Chips of the source before its first interior object."""
        return self.first * self.shard_size - self.start

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "first": self.first,
            "end": self.end,
            "shard_size": self.shard_size,
            "image_chunks": list(self.image_chunks),
            "label_chunks": list(self.label_chunks),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Interior:
        interior = cls(
            start=int(obj["start"]),
            first=int(obj["first"]),
            end=int(obj["end"]),
            shard_size=int(obj["shard_size"]),
            image_chunks=tuple(int(v) for v in obj["image_chunks"]),
            label_chunks=tuple(int(v) for v in obj["label_chunks"]),
        )
        if interior.first * interior.shard_size < interior.start or interior.end <= interior.first:
            raise ValueError(f"interior shards {interior.first}..{interior.end} do not fit")
        return interior


class WindowTotals(Protocol):
    """The statistics one read window contributes (`tiling.tiler.cut.WindowChips` has them)."""

    @property
    def sums(self) -> npt.NDArray[np.uint64]: ...
    @property
    def sums_sq(self) -> npt.NDArray[np.uint64]: ...
    @property
    def valid_px(self) -> int: ...
    @property
    def class_counts(self) -> npt.NDArray[np.int64]: ...
    @property
    def train(self) -> int: ...
    @property
    def val(self) -> int: ...


class CutWindow(WindowTotals, Protocol):
    """One read window's kept chips, encoded, with their index rows and statistics."""

    @property
    def images(self) -> list[EncodedChunk]: ...
    @property
    def labels(self) -> list[EncodedChunk]: ...
    @property
    def index(self) -> npt.NDArray[np.int32]: ...
    @property
    def candidates(self) -> int: ...


@dataclass(slots=True)
class SourceTotals:
    """Exact per-source statistics summed over its windows (integers, no rounding)."""

    num_classes: int
    sums: list[int] = field(default_factory=lambda: [0] * NUM_BANDS)
    sums_sq: list[int] = field(default_factory=lambda: [0] * NUM_BANDS)
    valid_px: int = 0
    class_counts: list[int] = field(default_factory=list)
    train: int = 0
    val: int = 0

    def __post_init__(self) -> None:
        if not self.class_counts:
            self.class_counts = [0] * self.num_classes

    def add(self, window: WindowTotals) -> None:
        self.sums = [a + int(b) for a, b in zip(self.sums, window.sums, strict=True)]
        self.sums_sq = [a + int(b) for a, b in zip(self.sums_sq, window.sums_sq, strict=True)]
        self.valid_px += window.valid_px
        self.class_counts = [
            a + int(b) for a, b in zip(self.class_counts, window.class_counts, strict=True)
        ]
        self.train += window.train
        self.val += window.val

    @property
    def band_stats(self) -> BandStats:
        return BandStats(sums=tuple(self.sums), sums_sq=tuple(self.sums_sq), count=self.valid_px)


@dataclass(slots=True)
class SourcePart:
    """One source's chips, encoded, in input order, with its statistics.

    A thin part (`interior` set) holds only the chunks of its head and tail: those of its
    interior shard objects are staged as the objects themselves (`tiling.tiler.interior`). Its
    index rows are always all there.
    """

    source_id: int
    key: str
    totals: SourceTotals
    images: list[EncodedChunk] = field(default_factory=list)
    labels: list[EncodedChunk] = field(default_factory=list)
    index: list[npt.NDArray[np.int32]] = field(default_factory=list)
    interior: Interior | None = None

    @property
    def num_chips(self) -> int:
        return len(self.images) + (self.interior.rows if self.interior else 0)

    def index_rows(self) -> npt.NDArray[np.int32]:
        if not self.index:
            return np.empty((0, 4), dtype=np.int32)
        return np.concatenate(self.index).astype(np.int32, copy=False).reshape(-1, 4)

    def nbytes(self) -> int:
        """Bytes of the encoded chunks (what the commit moves)."""
        return sum(len(c) for c in (*self.images, *self.labels) if c)


CutSource = Callable[[SourcePlan], Iterator[CutWindow]]  # a source's cut windows, in order


def build_part(
    source_id: int,
    key: str,
    num_classes: int,
    windows: Iterable[CutWindow],
    progress: Callable[[int], None] | None = None,
) -> SourcePart:
    """Gather a source's windows, in order, into one part."""
    part = SourcePart(source_id=source_id, key=key, totals=SourceTotals(num_classes))
    for window in windows:
        part.images.extend(window.images)
        part.labels.extend(window.labels)
        part.index.append(window.index)
        part.totals.add(window)
        if progress is not None:
            progress(window.candidates)
    return part


def part_key(
    params: StoreParams, source: SourcePlan, fingerprints: Mapping[str, Fingerprint]
) -> str:
    """Digest of everything that decides a part's bytes; a rerun reuses only equal keys."""

    def stamp(path: str) -> Any:
        fp = fingerprints.get(path)
        return fp.to_json() if fp is not None else None

    image = source.image.path
    what = {
        "part_format": PART_FORMAT_VERSION,
        "store_format": FORMAT_VERSION,
        "params": params.to_json(),
        "source_id": source.id,
        "image": [image, stamp(image)],
        "labels": [[lab.path, stamp(lab.path)] for lab in source.labels],
    }
    return content_key(what)


def run_key(params: StoreParams) -> str:
    """Digest of the store parameters (the list of inputs included): the key of the chip
    counts ranks publish. Unlike a part's key it needs no fingerprint, so a rank can name
    the count of a source it did not open."""
    what = {"part_format": PART_FORMAT_VERSION, "params": params.to_json()}
    return content_key(what, hex_digits=16)


def part_pieces(part: SourcePart) -> list[bytes]:
    """The part's bytes in order, as pieces (head, JSON header, index rows, chunks, key,
    crc32c): written one after the other, without joining them into one copy."""
    t = part.totals
    header = {
        "version": PART_FORMAT_VERSION,
        "key": part.key,
        "source_id": part.source_id,
        "chips": part.num_chips,
        "sums": t.sums,
        "sums_sq": t.sums_sq,
        "valid_px": t.valid_px,
        "class_counts": t.class_counts,
        "train": t.train,
        "val": t.val,
        "num_classes": t.num_classes,
        "image_sizes": [len(c) if c else _ABSENT for c in part.images],
        "label_sizes": [len(c) if c else _ABSENT for c in part.labels],
        "interior": part.interior.to_json() if part.interior else None,
    }
    head_json = json.dumps(header, separators=(",", ":")).encode()
    rows = np.ascontiguousarray(part.index_rows(), dtype="<i4").tobytes()
    pieces = [_HEAD.pack(_MAGIC, len(head_json)), head_json, rows]
    pieces += [c for c in part.images if c]
    pieces += [c for c in part.labels if c]
    pieces.append(part.key.encode())
    crc = 0
    for piece in pieces:
        crc = google_crc32c.extend(crc, piece)
    pieces.append(_TRAILER.pack(crc))
    return pieces


def encode_part(part: SourcePart) -> bytes:
    """The part as one object: head, JSON header, index rows, chunks, key, crc32c."""
    return b"".join(part_pieces(part))


def decode_part(data: bytes | mmap.mmap, *, key: str) -> SourcePart:
    """A part's content; ValueError naming why when it is damaged or was made for other inputs."""
    if len(data) < _HEAD.size + len(key) + _TRAILER.size:
        raise ValueError(f"{len(data)} bytes is shorter than a part's head")
    end = len(data) - _TRAILER.size
    (crc,) = _TRAILER.unpack(data[end:])
    # google_crc32c takes arrays, not memoryviews: a view of the bytes, no copy
    if crc != google_crc32c.value(np.frombuffer(data, dtype=np.uint8, count=end)):
        raise ValueError("checksum does not match (truncated or damaged)")
    magic, head_len = _HEAD.unpack(data[: _HEAD.size])
    if magic != _MAGIC:
        raise ValueError("not a staged part")
    if data[end - len(key) : end] != key.encode():
        raise ValueError("made for other inputs or options (key differs)")
    pos = _HEAD.size
    header = json.loads(data[pos : pos + head_len])
    pos += head_len
    if header.get("version") != PART_FORMAT_VERSION or header.get("key") != key:
        raise ValueError("made for other inputs or options (header differs)")
    chips = int(header["chips"])
    rows = np.frombuffer(data, dtype="<i4", count=4 * chips, offset=pos).reshape(chips, 4)
    pos += rows.nbytes
    images: list[EncodedChunk] = []
    labels: list[EncodedChunk] = []
    for sizes, out in ((header["image_sizes"], images), (header["label_sizes"], labels)):
        for size in sizes:
            if size == _ABSENT:
                out.append(None)
            else:
                out.append(data[pos : pos + size])
                pos += size
    interior = Interior.from_json(header["interior"]) if header.get("interior") else None
    if pos + len(key) != end or len(images) + (interior.rows if interior else 0) != chips:
        raise ValueError("sizes do not add up to the object")
    totals = SourceTotals(
        num_classes=int(header["num_classes"]),
        sums=[int(v) for v in header["sums"]],
        sums_sq=[int(v) for v in header["sums_sq"]],
        valid_px=int(header["valid_px"]),
        class_counts=[int(v) for v in header["class_counts"]],
        train=int(header["train"]),
        val=int(header["val"]),
    )
    return SourcePart(
        source_id=int(header["source_id"]),
        key=key,
        totals=totals,
        images=images,
        labels=labels,
        index=[rows.astype(np.int32)],
        interior=interior,
    )
