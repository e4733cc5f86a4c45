"""Output files: the overwrite policy, the checks before the work, and atomic writes.

`refuse_existing` is the one overwrite policy (as rasterio's `resolve_inout` with
`FileOverwriteError`): an output that exists (a symlink too, even a dangling one) is replaced
only when `--overwrite` was given. `check_output_file`, `check_can_create` and
`check_can_create_in` tell before any work whether an output can be written where it was asked
for (a directory that takes new files, not a directory where a file goes), and
`require_distinct` that no two outputs of one command, nor an output and an input, are one file.

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
   crash. Without `overwrite` it is hard-linked to the target instead, which fails if a file
   (or a symlink) appeared there after the command's own check: that file is never replaced.

Any failure (an exception, Ctrl-C, SIGTERM through the CLI) removes the temp file and leaves
the old target untouched; a file system that refuses the write (full, read-only, no permission)
becomes `OutputError`, one line naming the output and the fix. `write_files_atomic` writes
several files all or nothing: every temp file is complete before the first is put in place.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from landcover.errors import OutputError, OutputExistsError

logger = logging.getLogger(__name__)

__all__ = [
    "WRITE_FAILURE_ERRNOS",
    "check_can_create",
    "check_can_create_in",
    "check_output_file",
    "default_file_mode",
    "publish",
    "refuse_existing",
    "require_distinct",
    "write_atomic",
    "write_bytes_atomic",
    "write_failure_message",
    "write_files_atomic",
    "write_text_atomic",
]

# The file system refuses to store an output: full, over quota, read-only, no permission.
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
WRITE_FAILURE_ERRNOS = _FULL_ERRNOS | {errno.EROFS, errno.EACCES, errno.EPERM}
# os.link on a file system without hard links (some FUSE and SMB mounts)
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}
)

Writer = Callable[[str], object]


def refuse_existing(
    paths: Iterable[str | os.PathLike[str]],
    *,
    overwrite: bool,
    what: str = "it",
    exists: Callable[[str], bool] = os.path.lexists,
) -> None:
    """Raise `OutputExistsError` naming the first of `paths` that exists, unless `overwrite`.

    The message is "<path> exists; pass --overwrite to replace <what>" (`what` names the
    files when there are several, e.g. "the plan files"). Call it before the work that
    produces the outputs, so a refusal costs nothing. `exists` tells whether a path exists
    (a local file or symlink, dangling or not, by default; pass the storage's own check for
    URLs).
    """
    if overwrite:
        return
    for path in paths:
        if exists(os.fspath(path)):
            raise OutputExistsError(f"{path} exists; pass --overwrite to replace {what}")


def check_output_file(
    path: str | os.PathLike[str],
    *,
    option: str,
    overwrite: bool,
    example: str,
    what: str = "it",
) -> None:
    """Refuse the local output file `path` of `option` before any work: a directory there
    (the message suggests `path/<example>`), an existing file or symlink unless `overwrite`
    (`refuse_existing`), or a place where no file can be created (`check_can_create`)."""
    if Path(path).is_dir():
        raise OutputError(
            f"{option} {path} is a directory; give a file name like {Path(path) / example}"
        )
    refuse_existing([path], overwrite=overwrite, what=what)
    check_can_create(path, option=option)


def check_can_create(path: str | os.PathLike[str], *, option: str | None = None) -> None:
    """Raise `OutputError` unless a file can be created at `path`: the nearest existing
    directory on the way to it must take new entries (missing directories are created when
    writing starts). `option` names the command-line option in the message."""
    _probe(_label(option, path), Path(path).absolute().parent)


def check_can_create_in(directory: str | os.PathLike[str], *, option: str | None = None) -> None:
    """Raise `OutputError` unless files can be created in the output directory `directory`
    (or, while it does not exist, in the nearest existing directory above it)."""
    _probe(_label(option, directory), Path(directory).absolute())


def require_distinct(
    outputs: Sequence[tuple[str, str | None]], *, inputs: Sequence[tuple[str, str]] = ()
) -> None:
    """Raise `OutputError` when two of `outputs` ((option, path); None: not asked for) name
    one file, or an output names one of `inputs` ((what, path)): one would replace the other.
    Local paths are compared resolved (`./a.tif`, `a.tif`, a symlink to it and a hard link of
    it are one file), URLs as written. Cheap: call it before any work."""
    named = [(option, path) for option, path in outputs if path]
    for i, (option, path) in enumerate(named):
        for other_option, other in named[i + 1 :]:
            if _same_file(path, other):
                raise OutputError(
                    f"{option} {path} and {other_option} {other} are the same file; give each "
                    "output its own name"
                )
        for what, source in inputs:
            if _same_file(path, source):
                raise OutputError(
                    f"{option} {path} is the {what} {source}: writing it would replace the "
                    "input; choose another output name"
                )


def write_atomic(path: str | os.PathLike[str], write: Writer, *, overwrite: bool = True) -> None:
    """Put at `path` what `write(temp_path)` writes to a temp file beside it.

    `write` gets the temp file's path (a str, as torch.save, savefig and GDAL want) and may
    reopen or truncate it, but must leave the content at that path. Parent directories are
    created. Without `overwrite`, a file at `path` (one that appeared after the command's
    check) raises `OutputExistsError` and is kept. See the module docstring for the guarantees.
    """
    write_files_atomic([(path, write)], overwrite=overwrite)


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, overwrite: bool = True
) -> None:
    """`write_atomic` of `data`."""
    write_atomic(path, lambda tmp: Path(tmp).write_bytes(data), overwrite=overwrite)


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", overwrite: bool = True
) -> None:
    """`write_atomic` of `text` in `encoding`."""
    write_atomic(
        path, lambda tmp: Path(tmp).write_text(text, encoding=encoding), overwrite=overwrite
    )


def write_files_atomic(
    files: Sequence[tuple[str | os.PathLike[str], Writer]], *, overwrite: bool
) -> None:
    """`write_atomic` for several (path, write) at once, all or nothing: every temp file is
    written and fsynced before the first is put in place, and a failure removes the temp
    files, and without `overwrite` also the files this call already put in place."""
    staged: list[tuple[Path, str]] = []
    placed: list[Path] = []
    current = Path()
    try:
        for path, write in files:
            current = Path(path)
            current.parent.mkdir(parents=True, exist_ok=True)
            mode = _mode_for(current)
            fd, tmp = tempfile.mkstemp(
                prefix=f".{current.name}.", suffix=".tmp", dir=current.parent
            )
            os.close(fd)
            staged.append((current, tmp))
            write(tmp)
            _fsync_file(tmp)
            os.chmod(tmp, mode)
        for current, tmp in staged:
            publish(tmp, current, overwrite=overwrite)
            placed.append(current)
    except BaseException as exc:
        for _, leftover in staged:
            Path(leftover).unlink(missing_ok=True)
        if not overwrite:  # only new files were placed: nothing of the user's goes
            for done in placed:
                done.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in WRITE_FAILURE_ERRNOS:
            raise OutputError(write_failure_message(current, exc)) from exc
        raise
    for directory in dict.fromkeys(target.parent for target, _ in staged):
        _fsync_directory(directory)


def publish(
    tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, overwrite: bool
) -> None:
    """Put the finished file `tmp` at `target` (in the same directory): renamed over it with
    `overwrite`; else hard-linked there, which fails with `OutputExistsError` if anything
    (a file, a symlink, even a dangling one) is at `target` by now, and the temp name removed.
    On a file system without hard links the check is repeated right before the rename. A
    file system's refusal (`WRITE_FAILURE_ERRNOS`) raises `OutputError` naming `target`."""
    try:
        _put_in_place(tmp, target, overwrite=overwrite)
    except OSError as exc:
        if exc.errno in WRITE_FAILURE_ERRNOS:
            raise OutputError(write_failure_message(target, exc)) from exc
        raise


def _put_in_place(
    tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, overwrite: bool
) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise OutputExistsError(f"{target} exists; pass --overwrite to replace it") from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(target):
            raise OutputExistsError(f"{target} exists; pass --overwrite to replace it") from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def write_failure_message(path: str | os.PathLike[str], exc: OSError) -> str:
    """The one line for an output the file system refused (`exc`, one of
    `WRITE_FAILURE_ERRNOS`): the path, the reason and the fix."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in _FULL_ERRNOS:
        fix = "free some space there or choose another output"
    elif exc.errno == errno.EROFS:
        fix = "choose an output on a writable file system"
    else:
        fix = "check its permissions or choose a writable directory"
    return f"{path}: cannot write it ({reason}); {fix}"


def default_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 without the umask's bits."""
    return 0o666 & ~_current_umask()


def _label(option: str | None, path: str | os.PathLike[str]) -> str:
    return f"{option} {os.fspath(path)}" if option else os.fspath(path)


def _probe(label: str, directory: Path) -> None:
    """Create and remove a file in the nearest existing directory of `directory` and above:
    permissions alone do not tell (root, read-only mounts, /proc)."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise OutputError(f"{label}: {existing} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".landcover.", suffix=".probe", dir=existing)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputError(
            f"{label}: cannot create files in {existing} ({reason}); choose a writable directory"
        ) from None
    os.close(fd)
    os.unlink(probe)


def _same_file(a: str, b: str) -> bool:
    from tiling.urls import is_local, local_path  # zarr and fsspec: only when comparing

    if not (is_local(a) and is_local(b)):
        return a.rstrip("/") == b.rstrip("/")
    first, second = local_path(a), local_path(b)
    try:
        if first.resolve() == second.resolve():
            return True
        return first.exists() and second.exists() and first.samefile(second)
    except OSError:  # a symlink loop, an unreadable directory: compared as written
        return os.path.abspath(first) == os.path.abspath(second)


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
