"""Encoding chips and shard objects exactly as zarr's sharding codec does, off zarr's loop.

Why not `array[a:b] = chips`: zarr compresses every inner chunk through its asyncio
pipeline on one writer thread, which costs more than the compression itself
(`benchmarks/bench_tile.py`). Here each worker thread compresses the chips it cut (zstd
releases the GIL), and the single writer only concatenates finished chunks into shard objects
and PUTs them.

The objects are laid out as zarr 3's sharding codec lays them out for our arrays (tests
compare them with zarr's own, chunk for chunk): inner chunks as standard zstd frames followed
by the crc32c of the compressed bytes (`Crc32cCodec`, format version 2 on), chunks equal to
the fill value 0 left out (zarr's `write_empty_chunks=False`), chunks laid out in order,
then the index at the end: one (offset, nbytes) pair of little-endian uint64 per inner
chunk, 2**64 - 1 for absent ones, followed by its crc32c.

The frames are compressed at the store's level with the parameters zstd gives that level
for an input of unknown size (`chunk_compression_parameters`), whatever the chunk's size.
zarr's `ZstdCodec(level)` would let zstd pick by the input's size, and for an input of at
most 256 KiB (a 256 x 256 x 4 chip is exactly that) level 3 then searches shorter matches in
smaller tables, which costs more CPU than the whole chip store's other work together. Any
zstd frame decodes the same way whatever parameters made it, so zarr reads these chunks
with the `ZstdCodec` the arrays declare: readers and the store format are unchanged. Every
writer (ranks, tasks, resume, append, interior shards) encodes through `ChunkEncoder`, so
stores stay byte-identical across ranks.

Reading decodes the same bytes (`decode_shard`, `ChunkDecoder`) so that a reader can check
every checksum and see which chunks a shard object holds, from one GET per object.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache

import google_crc32c
import numpy as np
import numpy.typing as npt
import zstandard
from numcodecs import Zstd

MAX_UINT64 = np.uint64(2**64 - 1)
INDEX_ENTRY_BYTES = 16
CRC_BYTES = 4

EncodedChunk = bytes | None  # None: all fill value, not stored


class ChunkChecksumError(ValueError):
    """A chunk whose bytes do not match its crc32c, or that does not decompress."""


def with_crc32c(data: bytes) -> bytes:
    """`data` followed by its crc32c, little-endian (zarr's `Crc32cCodec`)."""
    crc: int = google_crc32c.value(data)
    return data + crc.to_bytes(CRC_BYTES, "little")


def strip_crc32c(data: bytes) -> npt.NDArray[np.uint8]:
    """The bytes before a trailing crc32c (a view), checked; `ChunkChecksumError` if not equal."""
    raw = np.frombuffer(data, dtype=np.uint8)  # google_crc32c takes arrays, not memoryviews
    if raw.size < CRC_BYTES:
        raise ChunkChecksumError(f"chunk of {raw.size} bytes is shorter than its checksum")
    body = raw[:-CRC_BYTES]
    stored = int(raw[-CRC_BYTES:].view("<u4")[0])
    if stored != google_crc32c.value(body):
        raise ChunkChecksumError("chunk checksum does not match")
    return body


@cache
def chunk_compression_parameters(level: int) -> zstandard.ZstdCompressionParameters:
    """zstd's parameters for `level` at an input of unknown (or more than 256 KiB) size: those
    every chunk is compressed with, so that a chip costs what the same pixels in a large
    strip cost."""
    # content size in the frame header, as zarr's ZstdCodec writes it: a reader sizes its
    # buffer from it; no frame checksum (the chunk's crc32c follows the frame)
    return zstandard.ZstdCompressionParameters.from_level(
        level, write_content_size=1, write_checksum=0
    )


# One compression context per thread and level: a zstandard compressor is not thread-safe,
# and a context per call would allocate and clear its tables for every chunk.
_compressors = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    by_level: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "by_level", None)
    if by_level is None:
        by_level = _compressors.by_level = {}
    compressor = by_level.get(level)
    if compressor is None:
        compressor = by_level[level] = zstandard.ZstdCompressor(
            compression_params=chunk_compression_parameters(level)
        )
    return compressor


class ChunkEncoder:
    """Compresses one chunk the way the store's codecs do: zstd, then crc32c if `checksum`.

    The zstd frames use `chunk_compression_parameters(level)`; any thread may call `encode`
    (each thread compresses with its own context). `checksum=False` gives the chunks of
    format version 1 stores (zstd alone).
    """

    def __init__(self, level: int, *, checksum: bool = True) -> None:
        self._level = level
        self._checksum = checksum

    def encode(self, chunk: npt.NDArray[np.uint8]) -> EncodedChunk:
        if not chunk.any():
            return None
        return self._finish(np.ascontiguousarray(chunk))

    def encode_any(
        self, chunk: npt.NDArray[np.generic], *, keep_empty: bool = False
    ) -> EncodedChunk:
        """Any dtype, stored little-endian as zarr's BytesCodec does.

        `keep_empty` stores an all-zero chunk too, so that its absence means it was lost.
        """
        if not keep_empty and not chunk.any():
            return None
        return self._finish(np.ascontiguousarray(chunk, dtype=chunk.dtype.newbyteorder("<")))

    def _finish(self, data: npt.NDArray[np.generic]) -> bytes:
        compressed = _compressor(self._level).compress(data.data)
        return with_crc32c(compressed) if self._checksum else compressed


class ChunkDecoder:
    """Checks and decompresses chunks written by `ChunkEncoder` (thread-safe)."""

    def __init__(self, *, checksum: bool) -> None:
        self._zstd = Zstd()
        self._checksum = checksum

    def decode_into(self, data: bytes, out: npt.NDArray[np.generic]) -> None:
        """Decompress one chunk into `out` (C-contiguous, of the chunk's exact size)."""
        body = strip_crc32c(data) if self._checksum else data
        try:
            decoded = self._zstd.decode(body)
        except RuntimeError as exc:  # numcodecs reports a bad zstd frame as RuntimeError
            raise ChunkChecksumError(f"chunk does not decompress ({exc})") from None
        raw = np.frombuffer(decoded, dtype=np.uint8)
        if raw.size != out.nbytes:
            raise ChunkChecksumError(f"chunk holds {raw.size} bytes, expected {out.nbytes}")
        out.reshape(-1).view(np.uint8)[:] = raw


def encode_shard(chunks: Sequence[EncodedChunk], chunks_per_shard: int) -> bytes | None:
    """A shard object holding `chunks` (chunk k at position k); None if all are absent."""
    if len(chunks) > chunks_per_shard:
        raise ValueError(f"{len(chunks)} chunks do not fit a shard of {chunks_per_shard}")
    index = np.full((chunks_per_shard, 2), MAX_UINT64, dtype="<u8")
    parts: list[bytes] = []
    offset = 0
    for k, data in enumerate(chunks):
        if not data:
            continue
        index[k] = (offset, len(data))
        parts.append(data)
        offset += len(data)
    if not parts:
        return None
    index_bytes = index.tobytes()
    crc = np.array([google_crc32c.value(index_bytes)], dtype="<u4").tobytes()
    return b"".join([*parts, index_bytes, crc])


def decode_shard(data: bytes, chunks_per_shard: int) -> list[EncodedChunk]:
    """The encoded chunks of a shard object, in order (None where absent).

    `ValueError` if the object is shorter than its index, the index's checksum does not
    match, or an entry points outside the object.
    """
    index_len = chunks_per_shard * INDEX_ENTRY_BYTES
    if len(data) < index_len + CRC_BYTES:
        raise ValueError(f"shard of {len(data)} bytes is shorter than its index")
    index_bytes = data[-(index_len + CRC_BYTES) : -CRC_BYTES]
    crc = np.frombuffer(data[-CRC_BYTES:], dtype="<u4")[0]
    if int(crc) != google_crc32c.value(index_bytes):
        raise ValueError("shard index checksum does not match")
    index = np.frombuffer(index_bytes, dtype="<u8").reshape(chunks_per_shard, 2)
    chunks: list[EncodedChunk] = []
    data_len = len(data) - index_len - CRC_BYTES
    for offset, nbytes in index:
        if offset == MAX_UINT64:
            chunks.append(None)
        elif int(offset) + int(nbytes) > data_len:
            raise ValueError("shard index points past the end of the object")
        else:
            chunks.append(data[int(offset) : int(offset) + int(nbytes)])
    return chunks
