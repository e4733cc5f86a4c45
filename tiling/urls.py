"""Storage URLs: local paths, NFS mounts and fsspec URLs (`az://`, `memory://`, ...).

One place turns a URL plus `storage_options` into a zarr store or an fsspec filesystem and
turns the storage layer's many exception types into `StorageAccessError` with one line.
Filesystem objects are created on use, in the calling process: an adlfs client made before a
fork is bound to the parent's event loop and hangs in the child.
"""

from __future__ import annotations

import logging
import socket
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fsspec
import zarr.storage
from zarr.abc.store import ByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from tiling.errors import StorageAccessError, TilingError

logger = logging.getLogger(__name__)

AZURE_PROTOCOLS = ("az", "abfs", "abfss")
# A dead endpoint must fail in seconds, not after the Azure SDK's minutes of retries.
REACHABILITY_TIMEOUT_S = 5.0


def protocol(url: str) -> str:
    """The URL scheme ("file" for plain paths, also Windows-free `C:` style is not handled)."""
    scheme = urlsplit(url).scheme
    return scheme if len(scheme) > 1 else "file"


def is_local(url: str) -> bool:
    """True for a plain path (local disk or an NFS mount) or a file:// URL."""
    return protocol(url) in ("file", "local")


def local_path(url: str) -> Path:
    """The filesystem path of a local URL."""
    if url.startswith("file://"):
        return Path(url[len("file://") :])
    if url.startswith("local://"):
        return Path(url[len("local://") :])
    return Path(url)


def check_storage_options(urls: Iterable[str], storage_options: Mapping[str, Any] | None) -> None:
    """Refuse `--storage-options` when every URL of a command is a local path.

    Local paths go through zarr's LocalStore and plain file I/O, which take no options: keys
    given there would be dropped without a word (a typo'd account key, say, while the
    output quietly lands on local disk). With any remote URL they apply to that one.
    """
    if not storage_options:
        return
    urls = list(urls)
    if not urls or any(not is_local(u) for u in urls):
        return
    keys = ", ".join(sorted(str(k) for k in storage_options))
    raise StorageAccessError(
        f"--storage-options ({keys}) do not apply to local paths such as {urls[0]}; "
        "drop --storage-options, or use a URL such as az://container/path"
    )


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


def filesystem(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """A synchronous fsspec filesystem and the path inside it (for globbing and listing)."""
    if is_local(url):
        return fsspec.filesystem("file"), str(local_path(url).absolute())
    check_reachable(url, storage_options)
    with storage_errors(url):
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, str(path)


def azure_endpoint(storage_options: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """(host, port) of the blob endpoint that adlfs would talk to, if it can be told."""
    import os

    options = dict(storage_options or {})
    connection_string = options.get("connection_string") or os.environ.get(
        "AZURE_STORAGE_CONNECTION_STRING"
    )
    if connection_string:
        parts = dict(
            item.split("=", 1) for item in str(connection_string).split(";") if "=" in item
        )
        endpoint = parts.get("BlobEndpoint")
        if endpoint:
            split = urlsplit(endpoint)
            default_port = 443 if split.scheme == "https" else 80
            return split.hostname or "", split.port or default_port
        account = parts.get("AccountName")
        suffix = parts.get("EndpointSuffix", "core.windows.net")
        return (f"{account}.blob.{suffix}", 443) if account else None
    account = options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if account:
        host = options.get("account_host") or f"{account}.blob.core.windows.net"
        return str(host), 443
    return None


def check_reachable(url: str, storage_options: Mapping[str, Any] | None) -> None:
    """For az:// URLs: fail fast, with one line, when the account endpoint does not answer."""
    if protocol(url) not in AZURE_PROTOCOLS:
        return
    endpoint = azure_endpoint(storage_options)
    if endpoint is None:
        raise StorageAccessError(
            f"{url}: no Azure account given; pass --storage-options "
            '\'{"account_name": "...", "account_key": "..."}\' or a connection_string, '
            "or set AZURE_STORAGE_CONNECTION_STRING"
        )
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=REACHABILITY_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StorageAccessError(
            f"{url}: cannot reach storage account endpoint {host}:{port} ({reason}); "
            "check account_name / connection_string in --storage-options "
            "or AZURE_STORAGE_CONNECTION_STRING"
        ) from exc


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn storage-layer failures (network, auth, bad options) into `StorageAccessError`."""
    try:
        yield
    except (TilingError, FileNotFoundError, FileExistsError):
        raise
    except (OSError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageAccessError(
            f"{url}: storage error ({type(exc).__name__}: {first}); "
            "check the URL and --storage-options"
        ) from exc
    except Exception as exc:
        # azure.core.exceptions.* and aiohttp errors do not subclass OSError.
        module = type(exc).__module__
        if module.startswith(("azure", "aiohttp", "adlfs", "fsspec")):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise StorageAccessError(
                f"{url}: storage error ({type(exc).__name__}: {first}); "
                "check the URL, the account and --storage-options"
            ) from exc
        raise
