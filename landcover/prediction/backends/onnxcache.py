"""Model files exported once to ONNX, cached by the digest of their bytes.

`predict --backend onnxruntime` (or `auto` where onnxruntime is the pick) runs a `model.pt`
through its ONNX export. Exporting costs seconds to a minute (torch's dynamo exporter), so
the file is written once and found again by every later run, rank, tile and task:

- its name holds the SHA-256 of the model file's bytes (`model_digest`): beside a local model
  file whose directory is writable, `<stem>.<first 16 hex digits>.onnx`; otherwise in the
  user's cache, `$XDG_CACHE_HOME/landcover/onnx/<digest>.onnx` (`~/.cache` by default);
- the file records the whole digest in its metadata (`landcover.models.export`), and a cached
  file is used only when that digest is the model file's now: a model rewritten in place, or a
  cache file damaged or left by another model, is exported again, never trusted;
- it is written atomically (a temp file renamed into place), by one process at a time on a
  machine (an flock per digest: ranks and tasks started together wait for the first one's
  export instead of each exporting); processes on other machines of a shared file system
  that miss each other's lock each write a whole file of the same model, and the last rename
  wins;
- an older export of the same model file beside it (another digest, the model since retrained)
  is removed when the new one is in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from landcover.errors import ModelFileError, PredictionError
from landcover.models.export import (
    export_model,
    model_digest,
    onnx_model_digest,
    require_onnx,
)
from landcover.outputlock import user_lock_dir
from tiling.runtime.urls import is_local, local_path

__all__ = ["cache_dir", "cached_onnx", "machine_lock", "onnx_cache_path", "recorded_digest"]

logger = logging.getLogger(__name__)

BESIDE_DIGEST_HEX = 16  # 64 bits in the name beside the model; the whole digest is inside


def cache_dir() -> Path:
    """The user's cache of exported models: `$XDG_CACHE_HOME/landcover/onnx`, by default
    `~/.cache/landcover/onnx`."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "landcover" / "onnx"


def onnx_cache_path(model_url: str, digest: str) -> Path:
    """Where the ONNX export of the model file `model_url` (of SHA-256 `digest`) is cached:
    beside a local model file in a writable directory, else in `cache_dir()`."""
    if is_local(model_url):
        model = local_path(model_url).absolute()
        if os.access(model.parent, os.W_OK | os.X_OK):
            return model.with_name(f"{model.stem}.{digest[:BESIDE_DIGEST_HEX]}.onnx")
    return cache_dir() / f"{digest}.onnx"


def recorded_digest(path: Path) -> str | None:
    """The model digest an exported ONNX file records; None when there is no file, it is not
    a readable ONNX file, or it records none."""
    if not path.is_file():
        return None
    onnx = require_onnx("onnx")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # onnx raises protobuf's DecodeError and its own errors: not usable
        return None
    return onnx_model_digest({p.key: p.value for p in proto.metadata_props})


def cached_onnx(
    model_url: str, *, storage_options: Mapping[str, Any] | None = None
) -> tuple[Path, str]:
    """The path of the ONNX export of the model file `model_url` and the file's digest:
    the cached export when its recorded digest is the file's, else a new export (see the
    module docstring). Errors of the exporter are `landcover.errors.ExportError`."""
    digest = model_digest(model_url, storage_options=storage_options)
    path = onnx_cache_path(model_url, digest)
    if recorded_digest(path) == digest:
        return path, digest
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PredictionError(
            f"{model_url}: cannot cache its ONNX export in {path.parent} ({exc.strerror}); "
            "set XDG_CACHE_HOME to a writable directory, or use --backend torch"
        ) from None
    with _export_lock(digest):
        if recorded_digest(path) == digest:  # another process exported it meanwhile
            return path, digest
        started = time.perf_counter()
        logger.info("exporting %s to ONNX once (cached as %s)", model_url, path)
        # the options reach a remote model file only: export refuses them for a local one,
        # and a local model's prediction may carry them for its remote images or store
        options = None if is_local(model_url) else storage_options
        export_model(model_url, path, format="onnx", overwrite=True, storage_options=options)
        if recorded_digest(path) != digest:
            path.unlink(missing_ok=True)
            raise ModelFileError(
                f"{model_url} changed while it was exported to ONNX; run the command again "
                "once the model file is complete"
            )
        logger.info("exported %s in %.1f s", path.name, time.perf_counter() - started)
    _remove_older_exports(path, model_url)
    return path, digest


def _export_lock(digest: str) -> contextlib.AbstractContextManager[None]:
    """Hold, blocking, this machine's lock on exporting the model of `digest`."""
    return machine_lock(f"onnx-{digest[:32]}")


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold, blocking, this machine's lock `name` (a file in the temporary directory: a lock
    beside the model would stay there), in this user's lock folder."""
    locks = user_lock_dir()
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
        yield
    finally:
        os.close(fd)


def _remove_older_exports(path: Path, model_url: str) -> None:
    """Remove the exports beside a local model file of its earlier contents (other digests)."""
    if not is_local(model_url) or path.parent != local_path(model_url).absolute().parent:
        return
    stem = local_path(model_url).stem
    pattern = re.compile(rf"{re.escape(stem)}\.[0-9a-f]{{{BESIDE_DIGEST_HEX}}}\.onnx")
    for other in path.parent.iterdir():
        if other != path and pattern.fullmatch(other.name):
            with contextlib.suppress(OSError):
                other.unlink()
                logger.info("removed %s, the export of an earlier %s", other, Path(model_url))
