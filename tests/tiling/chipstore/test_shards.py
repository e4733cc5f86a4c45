"""Our shard encoder writes the very bytes zarr's sharding codec writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.support.chipstores import chips, record, small_params, snapshot
from tiling.chipstore.params import create_arrays
from tiling.chipstore.resume import open_writer
from tiling.chipstore.shards import ChunkEncoder, decode_shard, encode_shard
from tiling.chipstore.store import BandStats, open_store


def test_writer_objects_equal_what_zarr_itself_writes(tmp_path: Path) -> None:
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
    assert ours_objects == theirs_objects
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
