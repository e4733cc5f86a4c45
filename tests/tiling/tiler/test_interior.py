"""Interior shards: a source's whole shard objects, built by the rank that cut it and moved
into the store by rank 0, give the bytes the store's writer builds itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.chipstores import chips, record, small_params, snapshot, write_source
from tiling.chipstore.records import BandStats
from tiling.chipstore.resume import open_writer
from tiling.chipstore.shards import ChunkEncoder
from tiling.errors import StoreError
from tiling.tiler.commit import commit_part, placeable
from tiling.tiler.interior import interior_shards, split_part
from tiling.tiler.parts import SourcePart, SourceTotals, decode_part, encode_part
from tiling.tiler.staging import PartStaging


@pytest.mark.parametrize("shard", [1, 2, 3, 5])
def test_interior_shards_are_exactly_those_wholly_inside_the_rows(shard: int) -> None:
    for start in range(12):
        for count in range(12):
            inside = {
                k for k in range(30) if k * shard >= start and (k + 1) * shard <= start + count
            }
            assert set(interior_shards(start, count, shard)) == inside, (start, count)


def encoded_part(source_id: int, data: tuple[np.ndarray, ...]) -> SourcePart:
    """Chips as a cut part holds them: each chunk encoded at the store's level."""
    encoder = ChunkEncoder(small_params(()).compression_level)
    images, labels, index = data
    part = SourcePart(source_id=source_id, key="k" * 24, totals=SourceTotals(5))
    part.totals.train = len(images)
    part.images = [encoder.encode(chip) for chip in images]
    part.labels = [encoder.encode(chip) for chip in labels]
    part.index = [index]
    return part


def test_a_thin_part_and_its_objects_write_the_writers_bytes(tmp_path: Path) -> None:
    """Source 1 starts at row 7 of shards of 5: 3 head chips, shards 2 and 3 inside, 1 tail
    chip; shard 3's images are all fill (no object, as the writer leaves none)."""
    params = small_params(("s0", "s1", "s2"))
    first, middle, last = chips(7, seed=0), chips(14, seed=1), chips(4, seed=2)
    middle[0][8:13] = 0  # rows 15..19: images shard 3 stores no chunk
    whole = tmp_path / "whole.zarr"
    writer = open_writer(str(whole), params)
    for source_id, data in enumerate((first, middle, last)):
        write_source(writer, source_id, data)
    writer.finish()

    split = split_part(encoded_part(1, middle), 7, params)
    assert split is not None
    thin, objects = split
    assert thin.interior is not None and list(thin.interior.shards) == [2, 3]
    assert (thin.interior.head, thin.num_chips, len(thin.images)) == (3, 14, 4)
    assert thin.interior.image_chunks == (5, 0) and objects["images"][3] is None
    back = decode_part(encode_part(thin), key=thin.key)
    assert back.interior == thin.interior and back.images == thin.images

    moved = tmp_path / "moved.zarr"
    staging = PartStaging(str(moved))
    staging.put_interior(back, objects)
    writer = open_writer(str(moved), params)
    write_source(writer, 0, first)
    assert placeable(writer, back, staging)
    commit_part(writer, record(1), back, staging)
    write_source(writer, 2, last)
    writer.finish()
    assert snapshot(str(moved), {}) == snapshot(str(whole), {})
    assert not staging.has_interior(back)  # moved, not copied
    assert not placeable(writer, back, staging)  # and the store is past its row


def test_a_thin_part_fits_only_the_row_it_was_made_for(tmp_path: Path) -> None:
    params = small_params(("s0", "s1"))
    split = split_part(encoded_part(1, chips(14, seed=1)), 6, params)  # made for row 6
    assert split is not None
    thin, objects = split
    staging = PartStaging(str(tmp_path / "s.zarr"))
    staging.put_interior(thin, objects)
    writer = open_writer(str(tmp_path / "s.zarr"), params)
    write_source(writer, 0, chips(7, seed=0))  # the store is at row 7
    assert staging.has_interior(thin) and not placeable(writer, thin, staging)
    writer.begin_source(record(1))
    with pytest.raises(StoreError, match="do not start at row 7"):
        writer.skip_placed(range(2, 4), (5, 5), (5, 5))


def test_a_source_inside_one_shard_has_no_interior() -> None:
    assert split_part(encoded_part(1, chips(4, seed=1)), 6, small_params(("s",))) is None


def test_counts_are_published_and_read_back(tmp_path: Path) -> None:
    staging = PartStaging(str(tmp_path / "s.zarr"))
    assert staging.count(3, "r" * 16) is None
    staging.put_count(3, "r" * 16, 675)
    assert staging.count(3, "r" * 16) == 675 and staging.count(3, "q" * 16) is None
    assert staging.names() == frozenset()  # counts are not parts


def test_band_stats_of_a_thin_part_are_the_whole_sources() -> None:
    part = encoded_part(1, chips(14, seed=1))
    part.totals.sums = [1, 2, 3, 4]
    split = split_part(part, 7, small_params(("s",)))
    assert split is not None and split[0].totals == part.totals
    assert split[0].totals.band_stats == BandStats(sums=(1, 2, 3, 4), sums_sq=(0, 0, 0, 0))
