"""Every write path publishes beside its destination, and a directory output keeps its lock
inside itself:

- with `$TMPDIR` on another file system than the output (tmpfs against a data disk, the
  normal layout on NFS or Lustre too), every command that writes (the one COG, its quicklook,
  probabilities and STAC item, a tiled product, evaluate, train, tile, export, view, report,
  ...) succeeds: no rename crosses file systems (EXDEV);
- a tiled product's directory that is writable under a read-only parent works (its lock is
  inside it, not beside it);
- every output given as a file:// URL is written at its path (and `view` reads a file:// map);
- a full disk (a real tmpfs that fills up) or `ulimit -f` (EFBIG) under GDAL's writes of the
  one COG or a tiled product is one line naming the output and the cause, exit 2, nothing
  half-made that a rerun would trust; a quicklook.png that is a directory is refused before
  any work;
- an output whose name says another format (lc.png for the GeoTIFF, map.png for the page,
  chips.tif for the chip store, item.tif for the STAC item, model.png for an export) is
  refused in one line, before any work, nothing written.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from tests.landcover.cli.test_outputs import (
    WRITERS,
    Args,
    Inputs,
    assert_one_line_error,
    files_under,
    inputs,  # noqa: F401  (the module fixture, defined there once)
    leftovers,
    quick_runs,
)


def _tiled(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "tiles"
    args = ["predict", str(i.model), str(i.scene), "--out", f"{target}/", "--tile-size", "64"]
    return [*args, "--device", "cpu"], target


def _view(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "map.html"
    return ["view", str(i.prediction), "--out", str(target)], target


def _change(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "change"
    return ["change", str(i.prediction), str(i.prediction), "--out", str(target)], target


def _sample(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "sample.csv"
    return ["sample", str(i.prediction), "--out", str(target), "--size", "20"], target


def _tiled_ranks(i: Inputs, out: Path, spare: Path) -> Args:
    args, target = _tiled(i, out, spare)
    return [*args, "--nproc", "2"], target


# Every command's writer; demo runs tile, train and predict, each a writer here already.
EVERY_WRITER = {
    **{name: writer for name, writer in WRITERS.items() if name != "demo"},
    "predict --out DIR/ --tile-size": _tiled,
    "view": _view,
    "change": _change,
    "sample": _sample,
}


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


# Writers that train or start rank processes: seconds each, so `make test` runs them and
# `make test-fast` does not.
SLOW_WRITERS = frozenset({"train", "tune", "predict --out DIR/ --nproc 2"})


def writer_params(names: list[str]) -> list[Any]:
    """`names` as parameters, those of SLOW_WRITERS marked slow."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_WRITERS else n for n in names]


@pytest.mark.parametrize("name", writer_params([*EVERY_WRITER, "predict --out DIR/ --nproc 2"]))
def test_every_output_on_another_file_system_than_tmpdir_is_written(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
    tmpdir_elsewhere: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quick_runs(name, monkeypatch)
    writer = EVERY_WRITER.get(name, _tiled_ranks)  # ranks: the catalog after N ranks' tiles
    args, target = writer(inputs, tmp_path / "out", tmp_path / "spare")
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


# -- file:// URLs ---------------------------------------------------------------------------------


def _as_file_urls(args: list[str], out: Path) -> list[str]:
    """`args` with every path under `out` given as a file:// URL."""
    return [f"file://{a}" if a.startswith(str(out)) else a for a in args]


@pytest.mark.parametrize("name", writer_params(list(EVERY_WRITER)))
def test_every_output_given_as_a_file_url_is_written_at_its_path(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quick_runs(name, monkeypatch)
    out = tmp_path / "out"
    args, target = EVERY_WRITER[name](inputs, out, tmp_path / "spare")
    result = CliRunner().invoke(main, _as_file_urls(args, out))
    assert result.exit_code == 0, result.output
    assert target.exists() and not (tmp_path / "file:").exists()
    if name.startswith("predict --out"):
        quicklook = target / "quicklook.png" if target.is_dir() else Path(f"{target}.quicklook.png")
        assert quicklook.exists()
        page = tmp_path / "page.html"
        shown = CliRunner().invoke(main, ["view", f"file://{target}", "--out", str(page)])
        assert shown.exit_code == 0, shown.output


# -- a full disk, a file size limit, a directory at the quicklook ----------------------------------


def _one_cog(i: Inputs, out: Path) -> list[str]:
    return ["predict", str(i.model), str(i.scene), "--out", str(out / "lc.tif"), "--device", "cpu"]


def _product(i: Inputs, out: Path) -> list[str]:
    return _tiled(i, out, out)[0]


MAP_WRITERS = {"one COG": _one_cog, "tiled product": _product}


@pytest.mark.parametrize(
    ("name", "size"),
    [("one COG", "8k"), ("tiled product", "8k"), ("tiled product", "40k")],
    ids=["one COG", "tiled product: the first tile", "tiled product: a record"],
)
def test_a_disk_that_fills_up_is_one_line_and_the_rerun_trusts_nothing_half_made(
    name: str,
    size: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a file system that fills up needs a tmpfs mount: not root")
    disk = tmp_path / "disk"
    with _tmpfs(disk) as mounted:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mounted)], check=True)
        result = CliRunner().invoke(main, MAP_WRITERS[name](inputs, disk))
        line = assert_one_line_error(result, str(disk), "No space left on device")
        assert "storage-options" not in line and "internal error" not in line
        assert leftovers(disk) == [] and not (disk / "lc.tif").exists()
        subprocess.run(["mount", "-o", "remount,size=64m", str(mounted)], check=True)
        again = CliRunner().invoke(main, MAP_WRITERS[name](inputs, disk))
        assert again.exit_code == 0, again.output
        if name == "tiled product":
            tiles = disk / "tiles"
            assert len(list(tiles.glob("E*_N*.tif"))) == len(list(tiles.glob("records/E*.json")))
            assert (tiles / "collection.json").exists()


def _limited_to(size_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size_bytes, resource.RLIM_INFINITY))


@pytest.mark.parametrize("name", list(MAP_WRITERS))
def test_a_file_size_limit_is_one_line_naming_the_output(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`ulimit -f` (EFBIG; Python ignores SIGXFSZ) in a process of its own; stderr is the one
    line (before: libtiff's "_tiffSeekProc: File too large." lines, straight from the library,
    and GDAL's errors at INFO came first)."""
    args = MAP_WRITERS[name](inputs, tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-c", "from landcover.cli.app import main; main()", "-q", *args],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: _limited_to(2048),
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.stderr.splitlines() == errors and len(errors) == 1, done.stderr
    assert str(tmp_path / "out") in errors[0] and "ulimit -f" in errors[0]
    assert leftovers(tmp_path) == [] and not (tmp_path / "out" / "lc.tif").exists()


@pytest.mark.parametrize("name", list(MAP_WRITERS))
def test_a_directory_at_the_quicklook_is_refused_before_any_work(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    if name == "one COG":
        quicklook = out / "lc.tif.quicklook.png"
    else:
        first = CliRunner().invoke(main, _product(inputs, out))  # the product's own directory
        assert first.exit_code == 0, first.output
        (out / "tiles" / "quicklook.png").unlink()
        quicklook = out / "tiles" / "quicklook.png"
    quicklook.mkdir(parents=True)
    before = files_under(out)
    result = CliRunner().invoke(main, [*MAP_WRITERS[name](inputs, out), "--overwrite"])
    assert_one_line_error(result, f"{quicklook} is a directory", "--no-quicklook")
    assert files_under(out) == before


def test_a_killed_runs_temp_files_beside_the_one_cog_are_removed_by_the_next_run(
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    """kill -9 runs no clean-up: the next run into the output (its lock's holder, the only
    writer of those names) removes them."""
    out = tmp_path / "out"
    out.mkdir()
    left = [out / ".lc.tif.0123abcd.tiles.part.tif", out / ".lc.tif.0123abcd.cog.part.tif"]
    left.append(Path(f"{left[0]}.aux.xml"))
    for path in left:
        path.write_bytes(b"half")
    kept = out / ".other.tif.0123abcd.tiles.part.tif"  # another output's
    kept.write_bytes(b"half")
    result = CliRunner().invoke(main, _one_cog(inputs, out))
    assert result.exit_code == 0, result.output
    assert [p for p in left if p.exists()] == [] and kept.exists()


# -- a name that says another format ---------------------------------------------------------------


def _named(option_args: list[str]) -> Callable[[Inputs, Path], list[str]]:
    def args(i: Inputs, out: Path) -> list[str]:
        given = [a.format(out=out) for a in option_args]
        if given[0] in ("view", "tile"):
            source = str(i.prediction) if given[0] == "view" else str(i.scene)
            return [given[0], source, *given[1:]]
        if given[0] == "export":
            return ["export", str(i.model), *given[1:]]
        base = ["predict", str(i.model), str(i.scene), "--device", "cpu"]
        if "--out" not in given:
            base += ["--out", str(out / "lc.tif")]
        return [*base, *given]

    return args


OTHER_FORMATS = {
    "predict --out lc.png": (_named(["--out", "{out}/lc.png"]), "--out", "PNG"),
    "predict --out lc.jpg": (_named(["--out", "{out}/lc.jpg"]), "--out", "JPEG"),
    "predict --out lc.vrt": (_named(["--out", "{out}/lc.vrt"]), "--out", "VRT"),
    "predict --out lc.zarr": (_named(["--out", "{out}/lc.zarr"]), "--out", "Zarr"),
    "predict --probabilities p.png": (
        _named(["--probabilities", "{out}/p.png"]),
        "--probabilities",
        "PNG",
    ),
    "predict --stac-item item.tif": (
        _named(["--stac-item", "{out}/item.tif"]),
        "--stac-item",
        "TIFF",
    ),
    "view --out map.png": (_named(["view", "--out", "{out}/map.png"]), "--out", "PNG"),
    "export --format onnx --out model.png": (
        _named(["export", "--format", "onnx", "--out", "{out}/model.png"]),
        "--out",
        "PNG",
    ),
    "export --format torchscript --out model.onnx": (
        _named(["export", "--format", "torchscript", "--out", "{out}/model.onnx"]),
        "--out",
        "ONNX",
    ),
    "tile --out chips.tif": (
        _named(["tile", "--out", "{out}/chips.tif", "--chip-size", "32"]),
        "--out",
        "TIFF",
    ),
}


@pytest.mark.parametrize("name", list(OTHER_FORMATS))
def test_an_output_named_for_another_format_is_refused_before_any_work(
    name: str,
    inputs: Inputs,  # noqa: F811
    tmp_path: Path,
) -> None:
    args, option, said = OTHER_FORMATS[name]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, args(inputs, out))
    assert_one_line_error(result, option, said, "give a name like")
    assert not out.exists()
