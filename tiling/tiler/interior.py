"""Interior shards: the shard objects that hold only one source's chips.

Once the chips before a source are counted, the rank that cut it knows the row its chips
start at in the store, and so which shard objects lie wholly inside its rows: shards
ceil(start / S) up to floor(end / S), for S chips per shard. It builds those objects itself,
with the code and bytes the store's writer would use, and stages them beside its part; the
part it stages then holds only the chunks before and after them (its head and tail) and
says how many chunks each interior object stores. Rank 0 moves the interior objects into
the store (a rename on local disk and NFS) and appends only the head and the tail: the
encoded bytes of a source pass through rank 0 only where a shard object mixes two sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tiling.chipstore.params import StoreParams
from tiling.chipstore.shards import ChunkEncoder, EncodedChunk, encode_shard
from tiling.chipstore.store_format import INDEX_COLUMNS
from tiling.tiler.parts import Interior, SourcePart

# arrays with a shard object per shard index, in the order their objects are staged
SHARDED_ARRAYS = ("images", "labels", "index")


def interior_shards(start: int, chips: int, shard_size: int) -> range:
    """Shard indices whose objects hold only rows [start, start + chips)."""
    first = -(-start // shard_size)
    return range(first, max(first, (start + chips) // shard_size))


def _stored(chunks: Sequence[EncodedChunk]) -> int:
    return sum(1 for c in chunks if c is not None)


def split_part(
    part: SourcePart, start: int, params: StoreParams
) -> tuple[SourcePart, dict[str, dict[int, bytes | None]]] | None:
    """`part`, cut to start at row `start`, split into a thin part (head and tail chunks,
    every index row) and its interior shard objects by array and shard index (None: all
    chunks absent, no object). None when no shard object lies wholly inside it."""
    size = params.shard_size
    shards = interior_shards(start, part.num_chips, size)
    if not shards:
        return None
    lo, hi = shards.start * size - start, shards.stop * size - start
    rows = part.index_rows()
    encoder = ChunkEncoder(params.compression_level)
    objects: dict[str, dict[int, bytes | None]] = {name: {} for name in SHARDED_ARRAYS}
    image_chunks, label_chunks = [], []
    for k in shards:
        a = k * size - start
        images = part.images[a : a + size]
        image_chunks.append(_stored(images))
        objects["images"][k] = encode_shard(images, size)
        if params.has_labels:
            labels = part.labels[a : a + size]
            label_chunks.append(_stored(labels))
            objects["labels"][k] = encode_shard(labels, size)
        block = np.zeros((size, len(INDEX_COLUMNS)), dtype="<i4")
        block[:] = rows[a : a + size]
        objects["index"][k] = encoder.encode_any(block, keep_empty=True)
    if not params.has_labels:
        del objects["labels"]
    interior = Interior(
        start=start,
        first=shards.start,
        end=shards.stop,
        shard_size=size,
        image_chunks=tuple(image_chunks),
        label_chunks=tuple(label_chunks),
    )
    thin = replace(
        part,
        images=part.images[:lo] + part.images[hi:],
        labels=part.labels[:lo] + part.labels[hi:],
        index=[rows],
        interior=interior,
    )
    return thin, objects
