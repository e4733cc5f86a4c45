"""The staging folder of a distributed tile run: `<store>.parts/`, beside the store.

It is tiling's use of the staged-parts protocol (`tiling.staged`; docs/CONTRACTS.md,
"Staged parts" and "Distributed tiling"). It holds what ranks hand to rank 0: each
source's part (`tiling.tiler.parts`), the chip counts every owner publishes, and the interior shard
objects owners build (`tiling.tiler.interior`), which rank 0 moves into the store; and what rank 0
hands to the ranks: the run's plan (`tiling.tiler.planfile`). It lives beside
the store, never inside it: readers of the store never list it, and `--overwrite` (which
clears the store) never races with a rank that is writing into it. Every object is published
whole (`tiling.staged.StagedFolder`). A part needs no separate completion record: its body
ends with its key and a crc32c (`tiling.tiler.parts`), so it is its own record.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from tiling.runtime.urls import filesystem, local_path, storage_errors
from tiling.staged import StagedFolder, staging_url
from tiling.tiler.blobcopy import copy_blobs
from tiling.tiler.interior import SHARDED_ARRAYS
from tiling.tiler.parts import SourcePart, decode_part, part_pieces

logger = logging.getLogger(__name__)


class PartStaging:
    """The staging folder of one store (`tiling.staged.StagedFolder`): put, get (checked),
    list and remove parts, counts and interior objects.

    Works on local paths and NFS mounts (atomic rename) and on fsspec URLs such as az://
    (one upload per part). The filesystem is made on first use, in the process using it.
    """

    def __init__(self, store_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.store_url = store_url.rstrip("/")
        self.folder = StagedFolder(staging_url(store_url), storage_options)
        self.url = self.folder.url

    @staticmethod
    def name(source_id: int, key: str) -> str:
        return f"{source_id:06d}.{key}.part"

    @staticmethod
    def count_name(source_id: int, key: str) -> str:
        return f"{source_id:06d}.{key}.chips"  # key: `run_key`

    @staticmethod
    def plan_name(key: str) -> str:
        return f"plan.{key}.json"  # key: `tiling.tiler.planfile.plan_key`

    def put_plan(self, key: str, body: bytes) -> None:
        """Publish the run's plan (rank 0), whole: a reader sees all of it or nothing."""
        self.folder.put_bytes(self.plan_name(key), body)

    def get_plan(self, key: str) -> bytes | None:
        """The plan published under `key`; None when there is none (yet)."""
        return self.folder.read_bytes(self.plan_name(key))

    @staticmethod
    def object_name(part: SourcePart, array: str, k: int) -> str:
        """The staged name of interior shard object k of `array` for thin `part`."""
        start = part.interior.start if part.interior else 0
        return f"{part.source_id:06d}.{part.key}.{start}.{array}.{k}"

    def put_count(self, source_id: int, key: str, chips: int) -> None:
        """Publish how many chips source `source_id` keeps (its owner, once it is cut; `key`
        is `run_key`): the other ranks add these up to find where their sources start."""
        self.folder.put_bytes(self.count_name(source_id, key), str(chips).encode())

    def count(self, source_id: int, key: str) -> int | None:
        """The chips published for (source_id, key); None when not yet published."""
        data = self.folder.read_bytes(self.count_name(source_id, key))
        return int(data) if data is not None and data.isdigit() else None

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
        self.folder.put_many(data)

    def has_interior(self, part: SourcePart) -> bool:
        """Whether every interior object of `part` is staged (a commit moves them away)."""
        names = [name for _, _, name in self.interior_objects(part) if name is not None]
        with storage_errors(self.url):
            if self.folder.local:
                return all(os.path.isfile(self.folder.path(name)) for name in names)
            fs, root = self.folder.filesystem()
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
        the source can be authorized (`tiling.tiler.blobcopy`), else a read and an upload.
        FileNotFoundError when one is not staged (any already moved stay in the store, past
        its done rows: the next commit or resume rewrites or deletes them)."""
        moves = [(store_key(array, k), name) for array, k, name in self.interior_objects(part)]
        with storage_errors(self.url):
            if self.folder.local:
                store_dir = local_path(self.store_url)
                for key, name in moves:
                    target = store_dir / key
                    if name is None:
                        target.unlink(missing_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(self.folder.path(name), target)
                return
            fs, root = self.folder.filesystem()
            store_fs, store_root = filesystem(self.store_url, self.folder.storage_options)
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
        # pieces: no joined copy of a ~100 MB part on local disk
        self.folder.put_bytes(self.name(part.source_id, part.key), part_pieces(part))

    def get(self, source_id: int, key: str) -> SourcePart | None:
        """The part staged for (source_id, key), checked; None when absent or not trustworthy."""
        name = self.name(source_id, key)
        with self.folder.read(name) as data:
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
        found = self.folder.names()
        return frozenset(n for n in found if n.endswith(".part") and not n.startswith("."))

    def remove(self) -> None:
        """Delete the staging folder and everything in it (after the commit)."""
        self.folder.remove()
