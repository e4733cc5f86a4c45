"""The one atomic file writer of tiling, cluster and landcover, with one durability policy.

A reader sees the old file or the whole new one, never half of either, and a crash cannot
leave a renamed but empty file behind:

1. write to a temp file in the target's directory (`.<name>.<host>-<pid>.<random>.tmp`; a
   rename is only atomic within one file system),
2. flush it to the disk (fsync),
3. give it the permissions a plain `open(path, "w")` would: the mode asked for, else the
   existing file's mode when it replaces one, else 0o666 masked by the process umask (a temp
   file is created 0600, which would make a shared model.pt unreadable to the group),
4. rename it over the target, then fsync the directory so that the rename itself survives a
   crash. Without `overwrite` it is hard-linked to the target instead, which fails with
   `FileExistsError` naming the target if anything (a file, a symlink, even a dangling one)
   appeared there since the caller's check: that file is never replaced.

Any failure (an exception, Ctrl-C, SIGTERM) removes the temp file and leaves the old target
untouched. A process killed outright (SIGKILL, the OOM killer, a lost node) cannot: the first
write of a later process into that directory removes the temp files (and their side files,
`<temp>.*`) of writers of this host whose process is gone (`remove_dead_writers_temps`); a
live writer's, another host's, and any other file are left alone.

A file system's refusal (full, read-only, no permission: `WRITE_FAILURE_ERRNOS`) is raised
as an OSError of the same errno naming the target, not the temp file, for the one line a CLI
prints; landcover turns it into its own `OutputError` (`landcover.outputs`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = [
    "FULL_ERRNOS",
    "WRITE_FAILURE_ERRNOS",
    "Writer",
    "default_file_mode",
    "publish",
    "remove_dead_writers_temps",
    "replaced_when_done",
    "text_writer",
    "write_atomic",
    "write_bytes_atomic",
    "write_files_atomic",
    "write_text_atomic",
]

# The file system refuses to store a file: full, over quota, read-only, no permission.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
WRITE_FAILURE_ERRNOS = FULL_ERRNOS | {errno.EROFS, errno.EACCES, errno.EPERM}
# os.link on a file system without hard links (some FUSE and SMB mounts)
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}
)

Writer = Callable[[str], object]
"""Writes a file's content to the temp path it is given (a str, as torch.save, savefig and
GDAL want); it may reopen or truncate it, but must leave the content at that path."""


def write_atomic(
    path: str | os.PathLike[str],
    write: Writer,
    *,
    overwrite: bool = True,
    mode: int | None = None,
) -> None:
    """Put at `path` what `write(temp_path)` writes to a temp file beside it; parent
    directories are created. `mode` (e.g. 0o755 for a script) or the mode a plain `open`
    would give. See the module docstring for the guarantees."""
    write_files_atomic([(path, write)], overwrite=overwrite, modes={Path(path): mode})


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, overwrite: bool = True, mode: int | None = None
) -> None:
    """`write_atomic` of `data`."""
    write_atomic(path, lambda tmp: Path(tmp).write_bytes(data), overwrite=overwrite, mode=mode)


def write_text_atomic(
    path: str | os.PathLike[str],
    text: str,
    *,
    encoding: str = "utf-8",
    overwrite: bool = True,
    mode: int | None = None,
) -> None:
    """`write_atomic` of `text` in `encoding`."""
    write_atomic(path, text_writer(text, encoding), overwrite=overwrite, mode=mode)


def text_writer(text: str, encoding: str = "utf-8") -> Writer:
    """The `Writer` that writes `text` in `encoding` (for `write_files_atomic`)."""
    return lambda tmp: Path(tmp).write_text(text, encoding=encoding)


def write_files_atomic(
    files: Sequence[tuple[str | os.PathLike[str], Writer]],
    *,
    overwrite: bool,
    modes: Mapping[Path, int | None] | None = None,
) -> None:
    """`write_atomic` for several (path, write) at once, all or nothing: every temp file is
    written and fsynced before the first is put in place, and a failure removes the temp
    files, and without `overwrite` also the files this call already put in place. `modes`
    gives a target its mode; the others get the one a plain `open` would."""
    staged: list[tuple[Path, str]] = []
    placed: list[Path] = []
    current = Path()
    try:
        for path, write in files:
            current = Path(path)
            tmp = _temp_beside(current)
            staged.append((current, tmp))
            write(tmp)
            _finish(tmp, current, (modes or {}).get(current))
        for current, tmp in staged:
            _put_in_place(tmp, current, overwrite=overwrite)
            placed.append(current)
    except BaseException as exc:
        for _, leftover in staged:
            Path(leftover).unlink(missing_ok=True)
        if not overwrite:  # only new files were placed: nothing of the user's goes
            for done in placed:
                done.unlink(missing_ok=True)
        _reraise_naming(current, exc)
        raise
    for directory in dict.fromkeys(target.parent for target, _ in staged):
        _fsync_directory(directory)


@contextmanager
def replaced_when_done(path: Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temp path beside `path` to write (by any means: rasterio, a file object), put at
    `path` by `write_atomic`'s policy when the block ends, removed when it raises (Ctrl-C
    included). For writers that are not one call, e.g. a GeoTIFF written block by block."""
    tmp = _temp_beside(path)
    try:
        yield Path(tmp)
        _finish(tmp, path, mode)
        _put_in_place(tmp, path, overwrite=True)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        _reraise_naming(path, exc)
        raise
    _fsync_directory(path.parent)


def publish(
    tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, overwrite: bool = True
) -> None:
    """Put the finished file `tmp` (in `target`'s directory) at `target`: fsynced, renamed
    over it with `overwrite`, else hard-linked there (`FileExistsError` naming `target` if
    anything is there by now) and the temp name removed; then the directory is fsynced. The
    file keeps its mode. A file system's refusal is an OSError naming `target`."""
    try:
        _fsync_file(os.fspath(tmp))
        _put_in_place(os.fspath(tmp), Path(target), overwrite=overwrite)
    except OSError as exc:
        _reraise_naming(Path(target), exc)
        raise
    _fsync_directory(Path(target).parent)


def default_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 without the umask's bits."""
    return 0o666 & ~_current_umask()


# `.<name>.<host>-<pid>.<random>.tmp`, and side files a writer made beside it (GDAL's
# `<temp>.gpkg`, its journal): `<temp>.<anything>`. A host name holds no dot here.
_TEMP_NAME = re.compile(r"\..+\.(?P<host>[A-Za-z0-9-]*)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp(?:\..*)?")
_swept: set[str] = set()  # the directories this process has swept (once each)


def _writer_id() -> str:
    """`<host>-<pid>` of this process (dots and other characters of the host name as `-`)."""
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', socket.gethostname())}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's live process
        return True
    return True


def remove_dead_writers_temps(directory: str | os.PathLike[str]) -> list[str]:
    """Remove the temp files in `directory` (and their side files) that writers of this host
    left when they were killed: those named by this module whose process no longer runs.
    Returns the names removed. Called once per directory and process by every write."""
    host = _writer_id().rsplit("-", 1)[0]
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.fullmatch(entry.name)
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        try:
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    if removed:
        logger.info("removed %d temp file(s) of killed writers in %s", len(removed), directory)
    return removed


def _temp_beside(target: Path) -> str:
    target.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.abspath(target.parent)
    if key not in _swept:
        remove_dead_writers_temps(target.parent)
        _swept.add(key)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{_writer_id()}.", suffix=".tmp", dir=target.parent
    )
    os.close(fd)
    return tmp


def _finish(tmp: str, target: Path, mode: int | None) -> None:
    """Make the written temp file durable and give it its final mode, before the rename."""
    _fsync_file(tmp)
    os.chmod(tmp, mode if mode is not None else _mode_for(target))


def _reraise_naming(target: Path, exc: BaseException) -> None:
    """For a file system's refusal (or a target that appeared, or a directory at it), raise
    the same error naming `target` rather than the temp file; else return, for the caller to
    re-raise `exc`."""
    named = (*WRITE_FAILURE_ERRNOS, errno.EEXIST, errno.EISDIR)
    if not isinstance(exc, OSError) or exc.errno not in named:
        return
    if exc.filename != str(target) or exc.filename2 is not None:
        raise OSError(exc.errno, exc.strerror, str(target)) from exc


def _put_in_place(tmp: str, target: Path, *, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(target):  # no hard links: the check, right before the rename
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _mode_for(target: Path) -> int:
    # Replacing a file keeps its mode, as open(path, "w") on it would: a model a user made
    # private stays private after a retrain.
    try:
        info = target.stat()
    except OSError:
        return default_file_mode()
    return stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else default_file_mode()


def _current_umask() -> int:
    # /proc reads the umask without changing it; the os.umask(0) round trip below briefly
    # leaves it at 0, which another thread creating a file at that moment would inherit.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable; some file systems (network mounts, Windows)
    cannot fsync a directory, and there the rename is as durable as it gets."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        logger.debug("cannot open %s to fsync it: %s", directory, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        logger.debug("cannot fsync the directory %s: %s", directory, exc)
    finally:
        os.close(fd)
