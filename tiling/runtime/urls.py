"""Storage URLs: local paths, NFS mounts and fsspec URLs (`az://`, `memory://`, ...).

One place tells a local path from a URL, turns a URL plus `storage_options` into an fsspec
filesystem (`tiling.chipstore.zarrstore` makes the zarr store on top of it) and turns the storage
layer's many exception types into `StorageAccessError` with one line. Filesystem objects are
created on use, in the calling process: an adlfs client made before a fork is bound to the
parent's event loop and hangs in the child. fsspec is imported on first use, so that this
module stays cheap for cluster and the CLI.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tiling.errors import SourceNotFoundError, StorageAccessError, TilingError, reason
from tiling.runtime.atomic import WRITE_FAILURE_ERRNOS

if TYPE_CHECKING:
    import fsspec

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


def filesystem(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """A synchronous fsspec filesystem and the path inside it (for globbing and listing)."""
    import fsspec  # imports aiohttp and more: only when storage is touched

    if is_local(url):
        return fsspec.filesystem("file"), str(local_path(url).absolute())
    check_reachable(url, storage_options)
    with storage_errors(url):
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, str(path)


def azure_endpoint(storage_options: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """(host, port) of the blob endpoint that adlfs would talk to, if it can be told."""
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
    """Turn storage-layer failures (network, auth, bad options) into `StorageAccessError`.
    A local file system's refusal (full, read-only, no permission) is no storage error: it
    is raised as an OSError of its errno naming the file, for the one line of a write that
    failed (not "check the URL and --storage-options")."""
    try:
        yield
    except (TilingError, FileNotFoundError, FileExistsError):
        raise
    except OSError as exc:
        if exc.errno in WRITE_FAILURE_ERRNOS and is_local(url):
            raise OSError(exc.errno, exc.strerror, exc.filename or url) from exc
        raise _storage_error(url, exc) from exc
    except (TypeError, ValueError) as exc:
        raise _storage_error(url, exc) from exc
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


def storage_failure(name: str, exc: BaseException, fix: str) -> StorageAccessError:
    """The error "NAME (Type: first line of `exc`); FIX": a failure of storage or of a
    service that no rule of `remote_failure` words better."""
    return StorageAccessError(f"{name} ({type(exc).__name__}: {reason(exc)}); {fix}")


def _storage_error(url: str, exc: BaseException) -> StorageAccessError:
    return storage_failure(f"{url}: storage error", exc, "check the URL and --storage-options")


# Exception classes, by name, that mean the host did not answer: aiohttp's (fsspec's HTTP),
# requests' and urllib3's (pystac-client), so that neither client library need be importable.
_CONNECTION_ERRORS = frozenset(
    {"ClientConnectorError", "ConnectionError", "NewConnectionError", "ConnectTimeoutError"}
)


def remote_failure(url: str, exc: BaseException, *, name: str | None = None) -> TilingError | None:
    """The one-line error for a request to remote `url` that failed with `exc`, found in `exc`
    and the exceptions it chains: "not found (HTTP 404)" (SourceNotFoundError), "access denied
    (HTTP 403)", another HTTP status, or "cannot connect to HOST (reason)" (StorageAccessError);
    None when none of them says so (then the file itself is at fault). The message starts with
    `name` (default: the URL)."""
    name = url if name is None else name
    chain = exception_chain(exc)
    for error in chain:
        if isinstance(error, (ConnectionError, socket.gaierror)) or any(
            cls.__name__ in _CONNECTION_ERRORS for cls in type(error).__mro__
        ):
            split = urlsplit(url)
            host = split.hostname or url
            host = f"{host}:{split.port}" if split.port else host
            reasons = [_os_reason(e) for e in chain if isinstance(e, OSError) and e.strerror]
            why = f" ({reasons[0]})" if reasons else ""
            return StorageAccessError(
                f"{name}: cannot connect to {host}{why}; check the URL and the network"
            )
    for error in chain:
        status = getattr(error, "status", None) or getattr(error, "status_code", None)
        if isinstance(status, int) and status >= 400:
            if status in (404, 410):
                return SourceNotFoundError(f"{name}: not found (HTTP {status}); check the URL")
            if status in (401, 403):
                return StorageAccessError(
                    f"{name}: access denied (HTTP {status}); check the URL's signature or "
                    "token (signed URLs expire) and --storage-options"
                )
            kind = "server error" if status >= 500 else "request refused"
            return StorageAccessError(
                f"{name}: {kind} (HTTP {status}); check the URL, or try again later"
            )
    if any(isinstance(e, FileNotFoundError) for e in chain):
        return SourceNotFoundError(f"{name}: not found; check the URL")
    return None


def check_remote_file(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Ask the storage behind remote `url` for the file; raise `remote_failure`'s error when
    it is missing or its host does not answer. Returns for a local path, or a file that is
    there. Called after a read failed, to say why in words a user can act on."""
    if is_local(url):
        return
    fs, path = filesystem(url, storage_options)
    try:
        fs.info(path)
    except Exception as exc:
        raise remote_failure(url, exc) or _storage_error(url, exc) from None


def _os_reason(error: OSError) -> str:
    """ "Connection refused" rather than asyncio's "Connect call failed ('host', port)"."""
    if isinstance(error.errno, int) and error.errno > 0:  # a gaierror's are negative
        return os.strerror(error.errno)
    return str(error.strerror)


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it refers to: causes, contexts, urllib3's `reason`,
    aiohttp's `os_error`, and exceptions among the arguments (requests wraps that way)."""
    chain: list[BaseException] = []
    pending: list[object] = [exc]
    while pending:
        error = pending.pop(0)
        if not isinstance(error, BaseException) or any(error is seen for seen in chain):
            continue
        chain.append(error)
        pending += [error.__cause__, error.__context__, *error.args]
        pending += [getattr(error, "reason", None), getattr(error, "os_error", None)]
    return chain
