"""A zarr store for a chip store's URL: zarr's LocalStore for a path (atomic writes), else an
fsspec store that reads a shard's trailing index as an explicit byte range."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import zarr.storage
from zarr.abc.store import ByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from tiling.runtime.urls import check_reachable, is_local, local_path, storage_errors

__all__ = ["SuffixSafeFsspecStore", "zarr_store"]


def zarr_store(
    url: str, *, storage_options: Mapping[str, Any] | None = None, read_only: bool = False
) -> Store:
    """A zarr store for `url`: LocalStore for paths (atomic writes), else FsspecStore."""
    if is_local(url):
        return zarr.storage.LocalStore(local_path(url), read_only=read_only)
    check_reachable(url, storage_options)
    with storage_errors(url):
        store = SuffixSafeFsspecStore.from_url(
            url, storage_options=dict(storage_options or {}), read_only=read_only
        )
    _disarm_exit_finalizers(store.fs)
    return store


class SuffixSafeFsspecStore(zarr.storage.FsspecStore):
    """FsspecStore that reads "the last n bytes" as an explicit range.

    zarr asks for a shard's trailing index with a suffix request, which it passes on as a
    negative offset; adlfs sends that to Azure as is and the read fails ("Required
    Content-Range response header is missing"). One size lookup turns it into a plain range.
    """

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if isinstance(byte_range, SuffixByteRequest):
            path = f"{self.path.rstrip('/')}/{key}"
            try:
                size = int((await self.fs._info(path))["size"])
            except FileNotFoundError:
                return None
            byte_range = RangeByteRequest(max(0, size - byte_range.suffix), size)
        return await super().get(key, prototype, byte_range)


def _disarm_exit_finalizers(fs: object) -> None:
    """Keep adlfs's clean-up finalizers of an asynchronous filesystem from running at exit.

    adlfs registers `weakref.finalize(fs, sync, fs.loop, close_service_client, fs)`; for an
    asynchronous instance `fs.loop` is None, so at interpreter exit it prints a traceback
    ("RuntimeError: Loop is not running", adlfs#495, zarr-python#4221). The process is
    ending and the OS closes the sockets, so skipping them loses nothing.
    """
    registry = getattr(weakref.finalize, "_registry", None)
    if not isinstance(registry, dict):
        return
    for finalizer in list(registry):
        info = finalizer.peek()
        if info is not None and info[0] is fs:
            finalizer.atexit = False
