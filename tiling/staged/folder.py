"""The folder parts are staged in, and how a part's files are published there whole.

A staging folder is a local or mounted directory, or a prefix on blob storage (az://). Every
file is published whole, so a reader sees all of it or nothing: on local disk and NFS it is
written under a temporary name, fsynced and renamed over the final name
(`tiling.runtime.atomic`); on blob storage it is one upload (a blob is not visible before its
upload commits). Readers ask again each time (listings are not cached): another process may
have published since. The filesystem is made on first use, in the process using it, so a
folder can be handed to another process (a task scheduler's worker) before it is used.

Files are made in a scratch directory before they are published (`StagedFolder.scratch`):
for a local folder a hidden `.scratch-<token>/` inside it, so that the rename that publishes
a file never crosses file systems (the system's temporary directory is often tmpfs while the
folder is on a data disk or NFS: a rename between them fails with EXDEV). Each scratch
directory is held by an flock on its `.scratch-<token>.lock` for as long as it is used; the
kernel releases that lock when its process ends however it ends, so the next writer in the
folder removes the scratch directories a killed run left behind and never one in use.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec

from tiling.runtime.atomic import publish, replaced_when_done
from tiling.runtime.lockfile import still_at
from tiling.runtime.urls import filesystem, is_local, local_path, storage_errors

STAGING_SUFFIX = ".parts"
SCRATCH_PREFIX = ".scratch-"
_LOCK_SUFFIX = ".lock"


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
        if self.local:  # a local file system's refusal (full disk) stays an OSError
            pieces = [body] if isinstance(body, bytes) else body
            target = Path(self.path(name))
            with replaced_when_done(target) as tmp, tmp.open("wb") as file:
                file.writelines(pieces)
            return
        with storage_errors(self.url):
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
        should be in the folder's file system: `scratch()` gives a place; one elsewhere is
        copied beside `name` first), or one upload."""
        if self.local:
            target = Path(self.path(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                publish(local_file, target)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                with replaced_when_done(target) as beside:  # another file system: copy
                    shutil.copyfile(local_file, beside)
                os.unlink(local_file)
            return
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            fs.put_file(local_file, self.path(name))

    @contextlib.contextmanager
    def scratch(self) -> Iterator[str]:
        """A local directory to write files in before they are published, removed after:
        a hidden `.scratch-<token>/` in the folder when local (on its file system, so that
        publishing is a rename; the scratch directories of killed runs are removed first),
        else a temporary directory (the files are uploaded from there)."""
        if not self.local:
            with tempfile.TemporaryDirectory(prefix="landcover-part-") as scratch:
                yield scratch
            return
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        self.clear_stale_scratch()
        with _held_scratch(root) as scratch:
            yield str(scratch)

    def clear_stale_scratch(self) -> list[str]:
        """Remove the scratch directories (and what is in them: half-written files) that no
        live process holds: those of killed runs. Returns their names. Local folders only."""
        if not self.local or not os.path.isdir(self.root):
            return []
        root = Path(self.root)
        removed = []
        names = {
            entry.removesuffix(_LOCK_SUFFIX)
            for entry in os.listdir(root)
            if entry.startswith(SCRATCH_PREFIX)
        }
        for name in sorted(names):
            if _remove_if_stale(root / name):
                removed.append(name)
        return removed

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

    def delete(self, name: str) -> None:
        """Delete file `name` (a file that is not there is fine)."""
        if self.local:
            Path(self.path(name)).unlink(missing_ok=True)
            return
        with storage_errors(self.url):
            fs, _ = self.filesystem()
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(self.path(name))

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


@contextlib.contextmanager
def _held_scratch(root: Path) -> Iterator[Path]:
    """A new scratch directory in `root`, its lock held for the block; removed after."""
    while True:
        token = uuid.uuid4().hex[:12]
        directory = root / f"{SCRATCH_PREFIX}{token}"
        lock = Path(f"{directory}{_LOCK_SUFFIX}")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)  # the lock first, then the directory
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a cleaner holds it for a moment: take another token
            os.close(fd)
            continue
        if still_at(fd, lock):
            break
        os.close(fd)  # a cleaner removed it between our open and our flock
    try:
        directory.mkdir()
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def _remove_if_stale(directory: Path) -> bool:
    """Remove the scratch directory `directory` unless a live process holds its lock."""
    lock = Path(f"{directory}{_LOCK_SUFFIX}")
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:  # the lock goes last: a directory without one is being removed
        shutil.rmtree(directory, ignore_errors=True)
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # in use
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        return True
    finally:
        os.close(fd)
