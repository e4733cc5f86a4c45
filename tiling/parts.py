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

Parts live in `PartStaging`, a folder beside the store (`<store>.parts/`), never inside it:
readers of the store never list them, and `--overwrite` (which clears the store) never races
with a rank that is writing one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import fsspec
import google_crc32c
import numpy as np
import numpy.typing as npt

from tiling._atomic import replaced_when_done
from tiling.blobcopy import copy_blobs
from tiling.fingerprint import Fingerprint
from tiling.interior import SHARDED_ARRAYS, Interior
from tiling.params import StoreParams
from tiling.plan import SourcePlan
from tiling.records import NUM_BANDS, BandStats
from tiling.shards import EncodedChunk
from tiling.store_format import FORMAT_VERSION
from tiling.urls import filesystem, is_local, local_path, storage_errors

logger = logging.getLogger(__name__)

PART_FORMAT_VERSION = 2  # 2: a part may leave its interior shard objects beside it
STAGING_SUFFIX = ".parts"
_MAGIC = b"LCPART01"
_HEAD = struct.Struct("<8sQ")  # magic, header length
_TRAILER = struct.Struct("<I")  # crc32c of everything before it
_ABSENT = -1  # a chunk equal to the fill value: not stored


class WindowTotals(Protocol):
    """The statistics one read window contributes (`tiling.tile._WindowChips` has them)."""

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
    interior shard objects are staged as the objects themselves (`tiling.interior`). Its
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
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]


def run_key(params: StoreParams) -> str:
    """Digest of the store parameters (the list of inputs included): the key of the chip
    counts ranks publish. Unlike a part's key it needs no fingerprint, so a rank can name
    the count of a source it did not open."""
    what = {"part_format": PART_FORMAT_VERSION, "params": params.to_json()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


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


def staging_url(store_url: str) -> str:
    """Where the parts of the store at `store_url` are staged: `<store>.parts`."""
    return store_url.rstrip("/") + STAGING_SUFFIX


class PartStaging:
    """The staging folder of one store: put, get (checked), list and remove parts.

    Works on local paths and NFS mounts (atomic rename) and on fsspec URLs such as az://
    (one upload per part). The filesystem is made on first use, in the process using it.
    """

    def __init__(self, store_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.store_url = store_url.rstrip("/")
        self.url = staging_url(store_url)
        self._options = dict(storage_options or {})
        self._remote: tuple[fsspec.AbstractFileSystem, str] | None = None

    @staticmethod
    def name(source_id: int, key: str) -> str:
        return f"{source_id:06d}.{key}.part"

    @staticmethod
    def count_name(source_id: int, key: str) -> str:
        return f"{source_id:06d}.{key}.chips"  # key: `run_key`

    @staticmethod
    def object_name(part: SourcePart, array: str, k: int) -> str:
        """The staged name of interior shard object k of `array` for thin `part`."""
        start = part.interior.start if part.interior else 0
        return f"{part.source_id:06d}.{part.key}.{start}.{array}.{k}"

    def put_count(self, source_id: int, key: str, chips: int) -> None:
        """Publish how many chips source `source_id` keeps (its owner, once it is cut; `key`
        is `run_key`): the other ranks add these up to find where their sources start."""
        self._put_small(self.count_name(source_id, key), str(chips).encode())

    def count(self, source_id: int, key: str) -> int | None:
        """The chips published for (source_id, key); None when not yet published."""
        with self._read(self.count_name(source_id, key)) as data:
            if data is None or not bytes(data).isdigit():
                return None
            return int(bytes(data))

    def interior_objects(self, part: SourcePart) -> list[tuple[str, int, str | None]]:
        """(array, shard index, staged name) of each interior object of thin `part`; the
        name is None where the shard stores no chunk (no object, as the writer leaves it)."""
        inner = part.interior
        if inner is None:
            return []
        out: list[tuple[str, int, str | None]] = []
        for i, k in enumerate(inner.shards):
            counts = {"images": inner.image_chunks[i], "index": 1}
            if inner.label_chunks:
                counts["labels"] = inner.label_chunks[i]
            for array in SHARDED_ARRAYS:
                if array in counts:
                    out.append(
                        (array, k, self.object_name(part, array, k) if counts[array] else None)
                    )
        return out

    def put_interior(
        self, part: SourcePart, objects: Mapping[str, Mapping[int, bytes | None]]
    ) -> None:
        """Stage the interior shard objects of thin `part`, each whole (before the part)."""
        data: dict[str, bytes] = {}
        for array, k, name in self.interior_objects(part):
            body = objects[array][k]
            if name is not None and body is not None:
                data[name] = body
        if is_local(self.url):
            for name, body in data.items():
                self._put_small(name, body)
            return
        with storage_errors(self.url):
            fs, root = self._filesystem()
            fs.pipe({f"{root}/{name}": body for name, body in data.items()})  # concurrently

    def has_interior(self, part: SourcePart) -> bool:
        """Whether every interior object of `part` is staged (a commit moves them away)."""
        names = [name for _, _, name in self.interior_objects(part) if name is not None]
        with storage_errors(self.url):
            if is_local(self.url):
                folder = local_path(self.url)
                return all((folder / name).is_file() for name in names)
            fs, root = self._filesystem()
            prefix = self.object_name(part, "", 0).rsplit(".", 2)[0]  # one prefix listing
            try:
                found = {p.rsplit("/", 1)[-1] for p in fs.glob(f"{root}/{prefix}.*")}
            except FileNotFoundError:
                return False
            return all(name in found for name in names)

    def place(self, part: SourcePart, store_key: Callable[[str, int], str]) -> None:
        """Move the interior objects of `part` into the store, at `store_key(array, k)`;
        delete the store's object where the shard stores no chunk. On local disk and NFS
        each is a rename (no byte is copied); on Azure Blob storage a server-side copy when
        the source can be authorized (`tiling.blobcopy`), else a read and an upload.
        FileNotFoundError when one is not staged (any already moved stay in the store, past
        its done rows: the next commit or resume rewrites or deletes them)."""
        moves = [(store_key(array, k), name) for array, k, name in self.interior_objects(part)]
        with storage_errors(self.url):
            if is_local(self.url):
                folder, store_dir = local_path(self.url), local_path(self.store_url)
                for key, name in moves:
                    target = store_dir / key
                    if name is None:
                        target.unlink(missing_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(folder / name, target)
                return
            fs, root = self._filesystem()
            store_fs, store_root = filesystem(self.store_url, self._options)
            pairs = [(f"{root}/{name}", f"{store_root}/{key}") for key, name in moves if name]
            if not copy_blobs(store_fs, pairs):  # no server-side copy: the bytes go through here
                bodies = fs.cat([source for source, _ in pairs], on_error="raise")
                store_fs.pipe({target: bodies[source] for source, target in pairs})
            for key, name in moves:
                if name is None:
                    with contextlib.suppress(FileNotFoundError):
                        store_fs.rm_file(f"{store_root}/{key}")

    def put(self, part: SourcePart) -> None:
        """Write `part` whole; a reader sees the complete object or none."""
        name = self.name(part.source_id, part.key)
        with storage_errors(self.url):
            if is_local(self.url):
                folder = local_path(self.url)
                folder.mkdir(parents=True, exist_ok=True)
                with replaced_when_done(folder / name) as tmp, tmp.open("wb") as file:
                    file.writelines(part_pieces(part))  # no joined copy of a ~100 MB part
            else:
                fs, root = self._filesystem()
                fs.pipe_file(f"{root}/{name}", encode_part(part))

    def get(self, source_id: int, key: str) -> SourcePart | None:
        """The part staged for (source_id, key), checked; None when absent or not trustworthy."""
        name = self.name(source_id, key)
        with self._read(name) as data:
            if data is None:
                return None
            try:
                part = decode_part(data, key=key)
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("%s/%s: staged part ignored (%s); it is redone", self.url, name, exc)
                return None
        if part.source_id != source_id:
            logger.warning("%s/%s: staged part of another source ignored", self.url, name)
            return None
        return part

    def names(self) -> frozenset[str]:
        """Names of the complete-looking parts staged now (temporary files left out)."""
        with storage_errors(self.url):
            if is_local(self.url):
                folder = local_path(self.url)
                found = [p.name for p in folder.iterdir()] if folder.is_dir() else []
            else:
                fs, root = self._filesystem()
                try:
                    found = [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
                except FileNotFoundError:
                    found = []
        return frozenset(n for n in found if n.endswith(".part") and not n.startswith("."))

    def remove(self) -> None:
        """Delete the staging folder and everything in it (after the commit)."""
        with storage_errors(self.url):
            if is_local(self.url):
                shutil.rmtree(local_path(self.url), ignore_errors=True)
                return
            fs, root = self._filesystem()
            with contextlib.suppress(FileNotFoundError):
                fs.rm(root, recursive=True)

    def _put_small(self, name: str, body: bytes) -> None:
        with storage_errors(self.url):
            if is_local(self.url):
                folder = local_path(self.url)
                folder.mkdir(parents=True, exist_ok=True)
                with replaced_when_done(folder / name) as tmp:
                    tmp.write_bytes(body)
            else:
                fs, root = self._filesystem()
                fs.pipe_file(f"{root}/{name}", body)

    def _filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        if self._remote is None:
            self._remote = filesystem(self.url, self._options)
        return self._remote

    @contextlib.contextmanager
    def _read(self, name: str) -> Iterator[bytes | mmap.mmap | None]:
        """The part's bytes, None when absent. A local part is mapped, not read: its chunks
        are copied once, from the page cache into the chunks decoded (no whole-part copy)."""
        with storage_errors(self.url):
            if not is_local(self.url):
                fs, root = self._filesystem()
                try:
                    remote: bytes | None = fs.cat_file(f"{root}/{name}")
                except FileNotFoundError:
                    remote = None
                yield remote
                return
            try:
                file = (local_path(self.url) / name).open("rb")
            except FileNotFoundError:
                yield None
                return
            with file:
                if os.fstat(file.fileno()).st_size == 0:  # mmap refuses an empty file
                    yield b""
                    return
                with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    yield mapped
