"""Server-side blob copies: what rank 0 uses to move interior shard objects into an az://
store without their bytes passing through it."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from tests.azurite import Azurite
from tiling.runtime.urls import filesystem
from tiling.tiler.blobcopy import copy_blobs


def test_a_filesystem_that_is_not_azure_blob_copies_nothing(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    fs = fsspec.filesystem("file")
    assert not copy_blobs(fs, [(str(tmp_path / "a"), str(tmp_path / "b"))])
    assert not (tmp_path / "b").exists()


@pytest.mark.azurite
def test_blobs_are_copied_whole_on_the_server(azurite: Azurite, tmp_path: Path) -> None:
    fs, root = filesystem(azurite.url(f"copy-{tmp_path.name}"), azurite.storage_options)
    fs.pipe_file(f"{root}/staged/a", b"bytes of a" * 1000)
    assert copy_blobs(fs, [(f"{root}/staged/a", f"{root}/store/a")])
    assert fs.cat_file(f"{root}/store/a") == b"bytes of a" * 1000
    with pytest.raises(FileNotFoundError):
        copy_blobs(fs, [(f"{root}/staged/missing", f"{root}/store/c")])
