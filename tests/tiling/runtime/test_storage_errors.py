"""`storage_errors`: a storage layer's failure is a one-line `StorageAccessError` naming the
URL and --storage-options, but a local file system's refusal stays the OSError of a failed
write (issue 41: a full local disk said "check the URL and --storage-options")."""

from __future__ import annotations

import errno

import pytest

from tiling.errors import StorageAccessError
from tiling.runtime.urls import storage_errors


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_local_refusal_is_a_failed_write(code: int) -> None:
    with pytest.raises(OSError) as raised, storage_errors("out/s.zarr"):
        raise OSError(code, "refused")
    assert not isinstance(raised.value, StorageAccessError)
    assert raised.value.errno == code and raised.value.filename == "out/s.zarr"


def test_a_remote_failure_names_the_url_and_the_options() -> None:
    with pytest.raises(StorageAccessError) as raised, storage_errors("az://c/s.zarr"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(raised.value) == (
        "az://c/s.zarr: storage error (OSError: [Errno 28] No space left on device); check the "
        "URL and --storage-options"
    )
