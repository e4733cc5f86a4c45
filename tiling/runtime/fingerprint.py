"""Fingerprints of input files, so a resumed store never keeps chips of a file that changed.

A fingerprint is the file's size, its modification stamp (mtime in nanoseconds for a local
file; the ETag, else the last-modified time, for an object in blob storage) and a SHA-256
of its first and last 64 KiB. The stamp catches an in-place rewrite that keeps the size;
the sample catches a copy that brought a new stamp but also new content at either end,
where GeoTIFF headers, tile offsets and overviews live. Costs one stat and two ranged reads
per file, never a full read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tiling.errors import SourceNotFoundError
from tiling.runtime.urls import filesystem, is_local, local_path, storage_errors

SAMPLE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """Size, modification stamp and a content sample of one file."""

    size: int
    modified: str
    sample_sha256: str

    def differences(self, now: Fingerprint) -> list[str]:
        """What changed from `self` (as recorded) to `now`, in words."""
        out = []
        if self.size != now.size:
            out.append(f"size {self.size} -> {now.size} bytes")
        if self.modified != now.modified:
            out.append("modification time")
        if self.sample_sha256 != now.sample_sha256:
            out.append("content")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "modified": self.modified, "sample_sha256": self.sample_sha256}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Fingerprint:
        return cls(
            size=int(obj["size"]),
            modified=str(obj["modified"]),
            sample_sha256=str(obj["sample_sha256"]),
        )


def fingerprint(path: str, storage_options: Mapping[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of a local file or an fsspec URL."""
    if is_local(path):
        return _local(str(local_path(path)))
    fs, inner = filesystem(path, storage_options)
    with storage_errors(path):
        info = fs.info(inner)
        size = int(info["size"])
        stamp = _remote_stamp(info)
        head = fs.cat_file(inner, start=0, end=min(size, SAMPLE_BYTES))
        tail = fs.cat_file(inner, start=max(0, size - SAMPLE_BYTES), end=size)
    return Fingerprint(size=size, modified=stamp, sample_sha256=_sample_hash(size, head, tail))


def fingerprints(
    paths: Sequence[str], storage_options: Mapping[str, Any] | None = None, *, workers: int = 8
) -> list[Fingerprint]:
    """Fingerprints of `paths`, in order, with a few requests in flight (blob latency)."""
    if len(paths) <= 1:
        return [fingerprint(p, storage_options) for p in paths]
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="fp") as pool:
        return list(pool.map(lambda p: fingerprint(p, storage_options), paths))


def stamp(path: str, storage_options: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """(size, modification stamp) of a file, as its `Fingerprint` has them: one stat (one
    metadata request on blob storage), no read."""
    if is_local(path):
        try:
            st = os.stat(local_path(path))
        except FileNotFoundError:
            raise SourceNotFoundError(f"{path}: no such file; check the path") from None
        return st.st_size, str(st.st_mtime_ns)
    fs, inner = filesystem(path, storage_options)
    with storage_errors(path):
        info = fs.info(inner)
    return int(info["size"]), _remote_stamp(info)


def stamps(
    paths: Sequence[str], storage_options: Mapping[str, Any] | None = None, *, workers: int = 16
) -> list[tuple[int, str]]:
    """`stamp` of each of `paths`, in order; remote ones a few requests in flight."""
    if all(is_local(p) for p in paths):
        return [stamp(p) for p in paths]  # a stat is microseconds: no pool
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stamp") as pool:
        return list(pool.map(lambda p: stamp(p, storage_options), paths))


def _remote_stamp(info: Mapping[str, Any]) -> str:
    """An object's modification stamp: its ETag, else its last-modified time."""
    return next(
        (
            str(info[k])
            for k in ("etag", "ETag", "last_modified", "LastModified", "mtime")
            if info.get(k) is not None
        ),
        "",
    )


def _local(path: str) -> Fingerprint:
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            head = f.read(SAMPLE_BYTES)
            f.seek(max(0, st.st_size - SAMPLE_BYTES))
            tail = f.read(SAMPLE_BYTES)
    except FileNotFoundError:
        raise SourceNotFoundError(f"{path}: no such file; check the path") from None
    return Fingerprint(
        size=st.st_size,
        modified=str(st.st_mtime_ns),
        sample_sha256=_sample_hash(st.st_size, head, tail),
    )


def _sample_hash(size: int, head: bytes, tail: bytes) -> str:
    digest = hashlib.sha256()
    digest.update(size.to_bytes(8, "little"))
    digest.update(head)
    digest.update(tail)
    return digest.hexdigest()
