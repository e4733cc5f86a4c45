"""Output files: the overwrite policy and atomic writes.

`refuse_existing` is the one overwrite policy (as rasterio's `resolve_inout` with
`FileOverwriteError`): an output that exists is replaced only when `--overwrite` was given.

`write_atomic` is the one way landcover replaces an output file (run.json, checkpoints,
model.pt, reports), so that a reader sees the old file or the whole new one, never half of
either:

1. write to a temp file in the target's directory (a rename is only atomic within one
   file system),
2. flush it to the disk (fsync), so a crash after the rename cannot leave a renamed but
   empty file behind,
3. give it the permissions a plain `open(path, "w")` would: the existing file's mode when it
   replaces one, else 0o666 masked by the process umask (a temp file is created 0600, which
   would make a shared model.pt unreadable to the group),
4. rename it over the target, then fsync the directory so that the rename itself survives a
   crash.

Any failure (an exception, Ctrl-C, SIGTERM through the CLI) removes the temp file and leaves
the old target untouched.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from landcover.errors import OutputExistsError

logger = logging.getLogger(__name__)

__all__ = [
    "default_file_mode",
    "refuse_existing",
    "write_atomic",
    "write_bytes_atomic",
    "write_text_atomic",
]


def refuse_existing(
    paths: Iterable[str | os.PathLike[str]],
    *,
    overwrite: bool,
    what: str = "it",
    exists: Callable[[str], bool] = os.path.exists,
) -> None:
    """Raise `OutputExistsError` naming the first of `paths` that exists, unless `overwrite`.

    The message is "<path> exists; pass --overwrite to replace <what>" (`what` names the
    files when there are several, e.g. "the plan files"). Call it before the work that
    produces the outputs, so a refusal costs nothing. `exists` tells whether a path exists
    (a local file by default; pass the storage's own check for URLs).
    """
    if overwrite:
        return
    for path in paths:
        if exists(os.fspath(path)):
            raise OutputExistsError(f"{path} exists; pass --overwrite to replace {what}")


def write_atomic(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Replace `path` by what `write(temp_path)` writes to a temp file beside it.

    `write` gets the temp file's path (a str, as torch.save, savefig and GDAL want) and may
    reopen or truncate it, but must leave the content at that path. Parent directories are
    created. See the module docstring for the guarantees.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """`write_atomic` of `data`."""
    write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """`write_atomic` of `text` in `encoding`."""
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding=encoding))


def default_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 without the umask's bits."""
    return 0o666 & ~_current_umask()


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
