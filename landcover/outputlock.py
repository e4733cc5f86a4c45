"""One run at a time into one output: the lock a command holds while it writes there.

`predict` stages its parts beside its output and removes them at the end, `train` writes and
clears a run dir, `tune` a study dir: a second run into the same place would delete or mix the
first one's files. Each holds `exclusive_writer` on a lock file for as long as it writes, so a
second run fails at once, in one line naming the holder's pid and the fix.

The lock is an flock: the kernel releases it when the holding process ends, however it ends
(SIGKILL, OOM killer, a node lost with its NFS client's lease), so a killed run never leaves a
lock that blocks the next one; a lock file left behind is taken over by the next run. Linux maps
flock to POSIX record locks on NFS, so ranks on other machines of a shared file system see it
too. An output on blob storage (az://) has no file to lock: its lock is a local file named by
its URL in this user's lock folder (`user_lock_dir`), which keeps out runs of the same user on
the same machine only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from landcover.errors import LandcoverError, OutputBusyError
from tiling.runtime.lockfile import still_at

__all__ = ["exclusive_outputs", "exclusive_writer", "lock_path_for", "user_lock_dir"]

LOCK_SUFFIX = ".lock"


INSIDE_LOCK = ".landcover.lock"


def user_lock_dir() -> Path:
    """This user's folder of machine-wide lock files in the temporary directory (not made
    here): one per user, since a folder shared by all is made by the first user with a umask
    that lets no other user create their locks in it."""
    return Path(tempfile.gettempdir()) / f"landcover-locks-{os.getuid()}"


def lock_path_for(output: str, *, inside: bool = False) -> Path:
    """The lock file of output `output` (a file or a directory): `<output>.lock` beside a local
    one, or with `inside` (a directory output whose parent may be read-only, e.g. a tiled
    product) the hidden `<output>/.landcover.lock`; for a URL, a file named by the URL's hash
    in this user's lock folder (`user_lock_dir`)."""
    from tiling.runtime.urls import is_local, local_path  # imports zarr: only when a lock is taken

    if is_local(output):
        local = local_path(output).absolute()
        if inside:
            return local / INSIDE_LOCK
        return local.with_name(local.name + LOCK_SUFFIX)
    digest = hashlib.sha256(output.rstrip("/").encode()).hexdigest()[:24]
    return user_lock_dir() / f"{digest}{LOCK_SUFFIX}"


@contextlib.contextmanager
def exclusive_writer(
    lock_path: Path,
    busy: str,
    *,
    error: type[LandcoverError] = OutputBusyError,
    remove: bool = True,
) -> Iterator[None]:
    """Hold the lock at `lock_path` for the block, or raise `error` at once with the line
    "`busy` (pid P); wait for it or choose another --out" when another process holds it.

    The holder's pid (and host) is written into the file for that line. `remove`: delete the
    lock file when the block ends (a file that must not stay beside the output); a run that
    opened it just before is then told apart by its inode and tries again on the new file.
    """
    made = not lock_path.parent.exists()
    lock_path.parent.mkdir(parents=True, exist_ok=True)  # as writing the output would
    fd = _acquire(lock_path, busy, error)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        yield
    finally:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)  # still locked: no other process holds this file now
            if made:  # a directory made for the lock and left empty by a failed run
                with contextlib.suppress(OSError):
                    lock_path.parent.rmdir()
        os.close(fd)


@contextlib.contextmanager
def exclusive_outputs(
    outputs: Iterable[str | None], command: str, *, inside: bool = False
) -> Iterator[None]:
    """Hold the lock of each of `outputs` (None: an output not asked for) for the block; a
    busy one raises `OutputBusyError`: "another COMMAND is writing OUT (pid P); ...". Taking
    and leaving it at once checks, before any work, that no run is writing them now.
    `inside`: the outputs are directories that hold their own lock (`lock_path_for`)."""
    with contextlib.ExitStack() as stack:
        for output in outputs:
            if output is not None:
                busy = f"another {command} is writing {output}"
                lock = lock_path_for(output, inside=inside)
                stack.enter_context(exclusive_writer(lock, busy))
        yield


def _acquire(lock_path: Path, busy: str, error: type[LandcoverError]) -> int:
    """An open descriptor of the lock file with the flock held (non-blocking)."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise error(f"{busy} ({holder}); wait for it or choose another --out") from None
        except BaseException:
            os.close(fd)
            raise
        if still_at(fd, lock_path):
            return fd
        os.close(fd)  # its last holder removed the file between our open and flock


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _describe_holder(fd: int) -> str:
    """ "pid 123" (with "on HOST" when not this machine) from the lock file's content."""
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        holder = json.loads(text)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: it is starting"
    here = host == socket.gethostname()
    return f"pid {pid}" if here else f"pid {pid} on {host}"
