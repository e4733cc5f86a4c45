"""Our shard encoder lays out shard objects as zarr's sharding codec does, with chunks that
zarr's codecs decode to the same pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
import zstandard
from numcodecs import Zstd

from tests.support.chipstores import chips, record, small_params, snapshot
from tiling.chipstore.params import create_arrays
from tiling.chipstore.resume import open_writer
from tiling.chipstore.shards import (
    ChunkEncoder,
    chunk_compression_parameters,
    decode_shard,
    encode_shard,
    strip_crc32c,
)
from tiling.chipstore.store import BandStats, open_store


def _decoded(data: bytes) -> bytes:
    """A chunk (zstd frame + crc32c) decoded by the codec zarr's ZstdCodec runs."""
    return bytes(Zstd().decode(strip_crc32c(data)))


def test_writer_objects_match_what_zarr_itself_writes(tmp_path: Path) -> None:
    params = small_params(("s0",))
    images, labels, index = chips(13, seed=3)
    images[4] = 0  # an all-fill chip: zarr leaves it out of the shard
    labels[6] = 0
    ours = str(tmp_path / "ours.zarr")
    writer = open_writer(ours, params)
    writer.begin_source(record(0))
    for lo in (0, 2, 9):  # uneven appends: shards are completed across calls
        hi = {0: 2, 2: 9, 9: 13}[lo]
        writer.append(images[lo:hi], labels[lo:hi], index[lo:hi])
    writer.commit_source(band_stats=BandStats(), class_counts=(0,) * 5, train_chips=13, val_chips=0)
    theirs = str(tmp_path / "zarr.zarr")
    group = zarr.open_group(theirs, mode="w")
    create_arrays(group, params)
    for name, data in (("images", images), ("labels", labels), ("index", index)):
        arr = group[name]
        assert isinstance(arr, zarr.Array)
        arr.resize((13, *arr.shape[1:]))
        arr[:] = data
    ours_objects = {
        k: v for k, v in snapshot(ours, {}).items() if "/c/" in k and not k.startswith("sources/")
    }
    theirs_objects = {k: v for k, v in snapshot(theirs, {}).items() if "/c/" in k}
    assert set(ours_objects) == {
        *(f"images/c/{k}/0/0/0" for k in range(3)),
        *(f"labels/c/{k}/0/0" for k in range(3)),
        *(f"index/c/{k}/0" for k in range(3)),
    }
    assert set(ours_objects) == set(theirs_objects)
    for key, obj in ours_objects.items():
        if key.startswith("index/"):  # one chunk an object, unsharded
            assert _decoded(obj) == _decoded(theirs_objects[key]), key
            continue
        ours_chunks = decode_shard(obj, params.shard_size)
        theirs_chunks = decode_shard(theirs_objects[key], params.shard_size)
        assert [c is None for c in ours_chunks] == [c is None for c in theirs_chunks], key
        for a, b in zip(ours_chunks, theirs_chunks, strict=True):
            assert a is None or b is None or _decoded(a) == _decoded(b), key
    for name, want in (("images", images), ("labels", labels)):  # zarr itself reads ours
        assert np.array_equal(np.asarray(zarr.open_array(ours, path=name, mode="r")[:]), want)
    read_images, read_labels = open_store(ours).read_chips(np.arange(13))
    assert np.array_equal(read_images, images)
    assert read_labels is not None and np.array_equal(read_labels, labels)


def test_decode_gives_back_the_encoded_chunks_and_checks_the_index() -> None:
    encoder = ChunkEncoder(3)
    rng = np.random.default_rng(0)
    chunks = [encoder.encode(rng.integers(0, 9, (4, 8, 8), dtype=np.uint8)) for _ in range(3)]
    chunks.insert(1, encoder.encode(np.zeros((4, 8, 8), dtype=np.uint8)))
    assert chunks[1] is None
    data = encode_shard(chunks, 6)
    assert data is not None
    assert decode_shard(data, 6) == [*chunks, None, None]
    damaged = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(ValueError, match="shard index checksum does not match"):
        decode_shard(damaged, 6)
    assert encode_shard([None, None], 4) is None


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((4, 8, 8), np.dtype(np.uint8)),  # a tiny chip
        ((4, 256, 256), np.dtype(np.uint8)),  # 256 KiB: where zstd would pick other parameters
        ((4, 300, 300), np.dtype(np.uint8)),  # larger than 256 KiB
        ((256, 256), np.dtype(np.uint8)),  # a label chip
        ((50, 4), np.dtype(">i4")),  # index rows, stored little-endian
    ],
)
def test_zarrs_codec_decodes_every_chunk_to_the_original(
    shape: tuple[int, ...], dtype: np.dtype[np.generic]
) -> None:
    rng = np.random.default_rng(1)
    chunk = rng.integers(0, 7, size=shape).astype(dtype)
    chunk.flat[0] = 1  # never all fill
    data = ChunkEncoder(3).encode_any(chunk)
    assert data is not None
    assert zstandard.get_frame_parameters(strip_crc32c(data).tobytes()).content_size == chunk.nbytes
    decoded = np.frombuffer(_decoded(data), dtype=dtype.newbyteorder("<")).reshape(shape)
    assert np.array_equal(decoded, chunk)


def test_a_chip_is_compressed_with_the_levels_large_input_parameters() -> None:
    """A 256 KiB chip gets level 3's parameters for a large input (those a strip of the same
    pixels gets), not the ones zstd picks by itself for an input of its size."""
    rng = np.random.default_rng(2)
    chip = np.repeat(rng.integers(0, 40, size=(4, 256, 64), dtype=np.uint8), 4, axis=2)
    data = ChunkEncoder(3).encode(chip)
    assert data is not None
    large = zstandard.ZstdCompressor(compression_params=chunk_compression_parameters(3))
    by_size = zstandard.ZstdCompressor(level=3)  # zstd's choice for a 256 KiB input
    assert large.compress(chip.tobytes()) != by_size.compress(chip.tobytes())  # the test tells
    assert strip_crc32c(data).tobytes() == large.compress(chip.tobytes())
