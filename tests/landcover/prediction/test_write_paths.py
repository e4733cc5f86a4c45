"""Every write path publishes beside its destination, and a directory output keeps its lock
inside itself:

- with `$TMPDIR` on another file system than the output (tmpfs against a data disk, the
  normal layout on NFS or Lustre too), every command that writes (the one COG, its quicklook,
  probabilities and STAC item, a tiled product, evaluate, train, tile, export, view, report,
  ...) succeeds: no rename crosses file systems (EXDEV);
- a tiled product's directory that is writable under a read-only parent works (its lock is
  inside it, not beside it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from tests.landcover.cli.test_outputs import (
    WRITERS,
    Args,
    Inputs,
    inputs,  # noqa: F401  (the module fixture, defined there once)
    quick_runs,
)


def _tiled(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "tiles"
    args = ["predict", str(i.model), str(i.scene), "--out", f"{target}/", "--tile-size", "64"]
    return [*args, "--device", "cpu"], target


def _view(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "map.html"
    return ["view", str(i.prediction), "--out", str(target)], target


EVERY_WRITER = {**WRITERS, "predict --out DIR/ --tile-size": _tiled, "view": _view}


def _device(path: Path) -> int:
    return os.stat(next(p for p in (path, *path.parents) if p.exists())).st_dev


@contextlib.contextmanager
def _tmpfs(at: Path) -> Iterator[Path]:
    """A small tmpfs mounted at `at` (root only), unmounted after."""
    at.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(at)], check=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False)


@pytest.fixture()
def tmpdir_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`$TMPDIR` (and Python's cached temporary directory) on another file system than
    `tmp_path`, where the outputs go: /dev/shm when it is one, else a tmpfs mounted for the
    test (root)."""
    with contextlib.ExitStack() as stack:
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK) and _device(shm) != _device(tmp_path):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=shm)))
        elif os.geteuid() == 0:
            folder = stack.enter_context(_tmpfs(Path(tempfile.mkdtemp(prefix="lc-tmpfs-"))))
        else:
            pytest.skip("no second file system for $TMPDIR: /dev/shm absent and not root")
        assert _device(folder) != _device(tmp_path)
        monkeypatch.setenv("TMPDIR", str(folder))
        monkeypatch.setattr(tempfile, "tempdir", str(folder))
        yield folder


@pytest.mark.parametrize("name", list(EVERY_WRITER))
def test_every_output_on_another_file_system_than_tmpdir_is_written(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
    tmpdir_elsewhere: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quick_runs(name, monkeypatch)
    args, target = EVERY_WRITER[name](inputs, tmp_path / "out", tmp_path / "spare")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert target.exists()
    if name.startswith("predict --out"):
        quicklook = target / "quicklook.png" if target.is_dir() else Path(f"{target}.quicklook.png")
        assert quicklook.exists()


def test_a_tiled_product_under_a_read_only_parent_is_written(
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    parent = tmp_path / "read-only"
    product = parent / "tiles"
    product.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        if os.geteuid() == 0:  # permissions do not stop root: a read-only bind mount does
            subprocess.run(["mount", "--bind", str(parent), str(parent)], check=True)
            stack.callback(subprocess.run, ["umount", "-l", str(parent)], check=False)
            remount = ["mount", "-o", "remount,ro,bind", str(parent)]
            subprocess.run(remount, check=True)
            stack.enter_context(_tmpfs(product))  # the product: writable, on its own mount
        else:
            parent.chmod(0o555)
            stack.callback(parent.chmod, 0o755)
        with pytest.raises(OSError):
            (parent / "probe").write_text("x")
        args, _ = _tiled(inputs, parent, tmp_path / "spare")
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert (product / "collection.json").exists() and (product / "quicklook.png").exists()
        assert not [p.name for p in product.iterdir() if p.name.startswith(".")]
