"""The folder parts are staged in, and how a part's files are published there whole.

A staging folder is a local or mounted directory, or a prefix on blob storage (az://). Every
file is published whole, so a reader sees all of it or nothing: on local disk and NFS it is
written under a temporary name, fsynced and renamed over the final name
(`tiling.shared.atomic`); on blob storage it is one upload (a blob is not visible before its
upload commits). Readers ask again each time (listings are not cached): another process may
have published since. The filesystem is made on first use, in the process using it, so a
folder can be handed to another process (a task scheduler's worker) before it is used.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec

from tiling.shared.atomic import publish, replaced_when_done
from tiling.shared.urls import filesystem, is_local, local_path, storage_errors

STAGING_SUFFIX = ".parts"


def staging_url(out: str) -> str:
    """Where the parts of the output at `out` are staged: `<out>.parts`, beside it (never
    inside: readers of the output never list the parts, and clearing the output for
    --overwrite never races with a rank writing a part)."""
    return out.rstrip("/") + STAGING_SUFFIX


class StagedFolder:
    """A folder (local path or URL) whose files are published whole and read afresh."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.local = is_local(self.url)
        self.storage_options = dict(storage_options or {})
        self._remote: tuple[fsspec.AbstractFileSystem, str] | None = None

    @property
    def root(self) -> str:
        """The folder's path: absolute on local disk, the path inside the filesystem else."""
        if self.local:
            return str(local_path(self.url).absolute())
        return self.filesystem()[1].rstrip("/")

    def path(self, name: str) -> str:
        """The path of file `name` (relative to the folder)."""
        return f"{self.root}/{name}"

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem of a remote folder and its path there (made once)."""
        if self._remote is None:
            self._remote = filesystem(self.url, self.storage_options)
        return self._remote

    def put_bytes(self, name: str, body: bytes | Iterable[bytes]) -> None:
        """Publish `body` (one bytes, or pieces written one after the other, without joining
        them into one copy on local disk) as file `name`."""
        with storage_errors(self.url):
            if self.local:
                pieces = [body] if isinstance(body, bytes) else body
                target = Path(self.path(name))
                with replaced_when_done(target) as tmp, tmp.open("wb") as file:
                    file.writelines(pieces)
                return
            data = body if isinstance(body, bytes) else b"".join(body)
            fs, _ = self.filesystem()
            fs.pipe_file(self.path(name), data)

    def put_many(self, bodies: Mapping[str, bytes]) -> None:
        """Publish each of `bodies` (name → bytes); on blob storage concurrently."""
        if self.local:
            for name, body in bodies.items():
                self.put_bytes(name, body)
            return
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            fs.pipe({self.path(name): body for name, body in bodies.items()})

    def put_file(self, local_file: str, name: str) -> None:
        """Publish the finished local file `local_file` as `name`: fsynced and renamed (it
        must be in the folder's file system: `scratch()` gives a place), or one upload."""
        if self.local:
            target = Path(self.path(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            publish(local_file, target)
            return
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            fs.put_file(local_file, self.path(name))

    @contextlib.contextmanager
    def scratch(self) -> Iterator[str]:
        """A local directory to write files in before they are published: the folder itself
        when local (a rename there is atomic), else a temporary directory, removed after."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            yield self.root
            return
        with tempfile.TemporaryDirectory(prefix="landcover-part-") as scratch:
            yield scratch

    @contextlib.contextmanager
    def read(self, name: str) -> Iterator[bytes | mmap.mmap | None]:
        """File `name`'s bytes, None when absent. A local file is mapped, not read: what the
        caller takes from it is copied once, from the page cache (no whole-file copy)."""
        with storage_errors(self.url):
            if not self.local:
                fs, _ = self.filesystem()
                try:
                    remote: bytes | None = fs.cat_file(self.path(name))
                except FileNotFoundError:
                    remote = None
                yield remote
                return
            try:
                file = open(self.path(name), "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                yield None
                return
            with file:
                if os.fstat(file.fileno()).st_size == 0:  # mmap refuses an empty file
                    yield b""
                    return
                with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    yield mapped

    def read_bytes(self, name: str) -> bytes | None:
        """File `name`'s bytes (a copy), None when absent."""
        with self.read(name) as data:
            return None if data is None else bytes(data)

    def names(self, under: str = "") -> set[str]:
        """The names of the files in the folder (or its subfolder `under`) now: one listing."""
        folder = self.path(under) if under else self.root
        with storage_errors(self.url):
            if self.local:
                return set(os.listdir(folder)) if os.path.isdir(folder) else set()
            fs, _ = self.filesystem()
            fs.invalidate_cache(folder)
            try:
                found = fs.ls(folder, detail=False)
            except FileNotFoundError:
                return set()
            return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in found}

    def size(self, name: str) -> int | None:
        """The size of file `name` in bytes, None when there is none."""
        path = self.path(name)
        with storage_errors(self.url):
            if self.local:
                return os.path.getsize(path) if os.path.isfile(path) else None
            fs, _ = self.filesystem()
            fs.invalidate_cache(path.rsplit("/", 1)[0])  # sizes may come from a listing
            try:
                return int(fs.size(path))
            except FileNotFoundError:
                return None

    def fetch(self, name: str, into: str) -> str:
        """A local path of file `name`: the file itself when local, else a download in `into`."""
        if self.local:
            return self.path(name)
        target = str(Path(into) / Path(name).name)
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            fs.get_file(self.path(name), target)
        return target

    def remove(self) -> None:
        """Delete the folder and everything in it (once the commit no longer needs it)."""
        if self.local:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            fs.invalidate_cache(self.root)
            with contextlib.suppress(FileNotFoundError):
                fs.rm(self.root, recursive=True)
