"""Server-side copies between blobs of one Azure storage account.

Rank 0 of a distributed tile run moves the shard objects other ranks built into the store.
On a file system that is a rename; on Azure Blob storage it is Copy Blob From URL with
`x-ms-requires-sync` (synchronous, up to 256 MiB a blob, shard objects are a few MiB): the
service copies the bytes, none pass through rank 0. The source is authorized with a SAS of
an hour made from the account key (given, or in the connection string) or with the
filesystem's own SAS token; with neither (a credential object, anonymous access) this returns
False and the caller copies the bytes itself.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec

# Copies in flight at once: each is one round trip of a few tens of ms.
COPY_THREADS = 16
_SAS_LIFETIME = datetime.timedelta(hours=1)


def copy_blobs(fs: fsspec.AbstractFileSystem, pairs: Sequence[tuple[str, str]]) -> bool:
    """Copy each (source, target) path of `fs` ("container/blob") on the server, each whole
    when it returns. False, copying nothing, when `fs` is not an Azure Blob filesystem this
    can authorize a source for; errors from the service are raised."""
    client = _service_client(fs)
    if client is None:
        return False
    from azure.core.exceptions import ResourceNotFoundError

    service, authorize = client

    def copy(pair: tuple[str, str]) -> None:
        source, target = (path.split("/", 1) for path in pair)
        url, headers = authorize(service.get_blob_client(source[0], source[1]))
        try:
            result = service.get_blob_client(target[0], target[1]).start_copy_from_url(
                url, requires_sync=True, **headers
            )
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(pair[0]) from exc
        if result.get("copy_status") != "success":
            raise OSError(f"copy of {pair[0]} to {pair[1]} did not complete: {result}")

    with ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="blobcopy") as pool:
        list(pool.map(copy, pairs))
    return True


def _service_client(fs: fsspec.AbstractFileSystem) -> tuple[Any, Any] | None:
    """A synchronous BlobServiceClient for `fs` and how to authorize a source blob's URL."""
    try:
        from adlfs import AzureBlobFileSystem
        from azure.storage.blob import BlobSasPermissions, BlobServiceClient, generate_blob_sas
    except ImportError:
        return None
    if not isinstance(fs, AzureBlobFileSystem):
        return None
    account_name, account_key = fs.account_name, fs.account_key
    if fs.connection_string:
        service = BlobServiceClient.from_connection_string(fs.connection_string)
        parts = dict(
            item.split("=", 1) for item in str(fs.connection_string).split(";") if "=" in item
        )
        account_name = parts.get("AccountName", account_name)
        account_key = parts.get("AccountKey", account_key)
    elif account_name and (account_key or fs.sas_token):
        host = getattr(fs, "account_host", None) or f"{account_name}.blob.core.windows.net"
        credential = (
            {"account_name": account_name, "account_key": account_key}
            if account_key
            else str(fs.sas_token).lstrip("?")
        )
        service = BlobServiceClient(f"https://{host}", credential=credential)
    else:
        return None
    if not ((account_name and account_key) or fs.sas_token):
        return None

    def authorize(blob: Any) -> tuple[str, dict[str, str]]:
        if account_name and account_key:
            sas = generate_blob_sas(
                account_name,
                blob.container_name,
                blob.blob_name,
                account_key=account_key,
                permission=BlobSasPermissions(read=True),
                expiry=datetime.datetime.now(datetime.UTC) + _SAS_LIFETIME,
            )
            return f"{blob.url}?{sas}", {}
        return f"{blob.url}?{str(fs.sas_token).lstrip('?')}", {}

    return service, authorize
