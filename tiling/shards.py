"""Encoding chips and shard objects exactly as zarr's sharding codec does, off zarr's loop.

Why not `array[a:b] = chips`: zarr compresses every inner chunk through its asyncio
pipeline on one writer thread, which measured about twice the cost of the compression
itself. Here each worker thread compresses the chips it cut (zstd releases the GIL), and
the single writer only concatenates finished chunks into shard objects and PUTs them.

The bytes are the ones zarr 3 writes for our arrays (tests compare them object for
object): inner chunks zstd-compressed (`ZstdCodec(level)`, no checksum), chunks equal to
the fill value 0 left out (zarr's `write_empty_chunks=False`), chunks laid out in order,
then the index at the end: one (offset, nbytes) pair of little-endian uint64 per inner
chunk, 2**64 - 1 for absent ones, followed by its crc32c. Reading stays with zarr.
"""

from __future__ import annotations

from collections.abc import Sequence

import google_crc32c
import numpy as np
import numpy.typing as npt
from numcodecs import Zstd

MAX_UINT64 = np.uint64(2**64 - 1)
INDEX_ENTRY_BYTES = 16
CRC_BYTES = 4

EncodedChunk = bytes | None  # None: all fill value, not stored


class ChunkEncoder:
    """Compresses one chunk the way zarr's `ZstdCodec(level=...)` does."""

    def __init__(self, level: int) -> None:
        self._zstd = Zstd(level=level, checksum=False)

    def encode(self, chunk: npt.NDArray[np.uint8]) -> EncodedChunk:
        if not chunk.any():
            return None
        return bytes(self._zstd.encode(np.ascontiguousarray(chunk)))

    def encode_any(self, chunk: npt.NDArray[np.generic]) -> EncodedChunk:
        """Any dtype, stored little-endian as zarr's BytesCodec does."""
        if not chunk.any():
            return None
        data = np.ascontiguousarray(chunk, dtype=chunk.dtype.newbyteorder("<"))
        return bytes(self._zstd.encode(data))


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
    """The encoded chunks of a shard object, in order (None where absent)."""
    index_len = chunks_per_shard * INDEX_ENTRY_BYTES
    if len(data) < index_len + CRC_BYTES:
        raise ValueError(f"shard of {len(data)} bytes is shorter than its index")
    index_bytes = data[-(index_len + CRC_BYTES) : -CRC_BYTES]
    crc = np.frombuffer(data[-CRC_BYTES:], dtype="<u4")[0]
    if int(crc) != google_crc32c.value(index_bytes):
        raise ValueError("shard index checksum does not match")
    index = np.frombuffer(index_bytes, dtype="<u8").reshape(chunks_per_shard, 2)
    chunks: list[EncodedChunk] = []
    for offset, nbytes in index:
        if offset == MAX_UINT64:
            chunks.append(None)
        else:
            chunks.append(data[int(offset) : int(offset) + int(nbytes)])
    return chunks
