"""Output files: the overwrite policy, the checks before the work, and landcover's errors
for atomic writes.

`refuse_existing` is the one overwrite policy (as rasterio's `resolve_inout` with
`FileOverwriteError`): an output that exists (a symlink too, even a dangling one) is replaced
only when `--overwrite` was given. A directory output (a report) holds one product:
`check_directory_output` refuses a directory holding anything without `--overwrite`, and
with it `finish_directory_output` removes what is left of the old product, so nothing of it
remains beside the new one. `check_output_file`, `check_can_create` and
`check_can_create_in` tell before any work whether an output can be written where it was asked
for (a directory that takes new files, not a directory where a file goes), and
`require_distinct` that no two outputs of one command, nor an output and an input, are one file.

`write_atomic` and its kin are the shared writer (`tiling.runtime.atomic`: temp file, fsync,
the permissions of a plain open, rename, fsync of the directory) under `output_errors`: a file
system that refuses the write (full, read-only, no permission) becomes `OutputError`, one line
naming the output and the fix, and a file that appeared after the command's check without
`--overwrite` becomes `OutputExistsError` (the file is kept).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from landcover.errors import OutputError, OutputExistsError
from landcover.writefailures import write_failure_message
from tiling.runtime import atomic
from tiling.runtime.atomic import WRITE_FAILURE_ERRNOS, Writer

__all__ = [
    "check_can_create",
    "check_can_create_in",
    "check_directory_output",
    "check_output_file",
    "check_output_format",
    "finish_directory_output",
    "local_output",
    "output_directory",
    "output_errors",
    "publish",
    "refuse_existing",
    "require_distinct",
    "write_atomic",
    "write_bytes_atomic",
    "write_files_atomic",
    "write_text_atomic",
]


def local_output(url: str) -> str:
    """`url` as the plain path every writer takes when it names a local file: a `file://`
    (or `local://`) URL loses its scheme (`file://localhost/x` too), keeping a trailing slash
    (a tiled product's directory); any other value is returned as it is. Called once, where a
    command or the API takes an output."""
    for scheme in ("file://", "local://"):
        if url.startswith(scheme):
            path = url[len(scheme) :]
            if path.startswith("localhost/"):
                path = path[len("localhost") :]
            return path or "/"
    return url


# What a file name's ending says the file holds: an output whose name says one format is
# never written in another (a GeoTIFF named lc.png opens nowhere as a PNG).
FORMAT_SUFFIXES: dict[str, str] = {
    ".tif": "GeoTIFF",
    ".tiff": "GeoTIFF",
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".jp2": "JPEG 2000",
    ".webp": "WebP",
    ".gif": "GIF",
    ".vrt": "GDAL VRT",
    ".zarr": "Zarr",
    ".nc": "NetCDF",
    ".h5": "HDF5",
    ".img": "ERDAS Imagine",
    ".gpkg": "GeoPackage",
    ".shp": "shapefile",
    ".parquet": "Parquet",
    ".csv": "CSV",
    ".json": "JSON",
    ".geojson": "GeoJSON",
    ".html": "HTML",
    ".htm": "HTML",
    ".md": "Markdown",
    ".pdf": "PDF",
    ".onnx": "ONNX",
    ".pt": "PyTorch",
}
GEOTIFF_SUFFIXES = (".tif", ".tiff")


def check_output_format(path: str, *, option: str, expected: Sequence[str], example: str) -> None:
    """Raise `OutputError` when the name of output `path` (of `option`) ends in another
    format's suffix than `expected` (e.g. lc.png for a GeoTIFF); a name without a known
    suffix passes. A directory's name (a trailing slash) is judged the same way."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    suffix = os.path.splitext(name)[1].lower()
    if suffix in FORMAT_SUFFIXES and suffix not in expected:
        wanted = FORMAT_SUFFIXES.get(expected[0], expected[0]) if expected else "this output"
        raise OutputError(
            f"{option} {path}: the name says {FORMAT_SUFFIXES[suffix]} ({suffix}), but this "
            f"output is written as {wanted}; give a name like {example}"
        )


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
    one file, or an output names one of `inputs` ((what, path)): one would replace the other;
    nor may an output directory (a tiled product's) hold an input: its tiles would be read
    back as inputs on a rerun.
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
            if _holds(path, source):
                raise OutputError(
                    f"{option} {path} holds the {what} {source}: a rerun would read the "
                    f"outputs written there back as inputs; keep the inputs outside {option}, "
                    f"or choose another {option}"
                )


@contextmanager
def output_errors() -> Iterator[None]:
    """landcover's errors for what the shared writer raises in the block: a target that
    appeared without `--overwrite` becomes `OutputExistsError`, a directory at the target or a
    file system's refusal (`WRITE_FAILURE_ERRNOS`) `OutputError` naming the output and the
    fix."""
    try:
        yield
    except OutputExistsError:
        raise
    except FileExistsError as exc:
        raise OutputExistsError(f"{exc.filename} exists; pass --overwrite to replace it") from None
    except IsADirectoryError as exc:
        raise OutputError(
            f"{exc.filename}: a directory is where this output goes; move it away or choose "
            "another output"
        ) from None
    except OSError as exc:
        if exc.errno in WRITE_FAILURE_ERRNOS:
            raise OutputError(write_failure_message(exc.filename or "a file", exc)) from exc
        raise


def write_atomic(path: str | os.PathLike[str], write: Writer, *, overwrite: bool = True) -> None:
    """`tiling.runtime.atomic.write_atomic` with landcover's errors (`output_errors`)."""
    with output_errors():
        atomic.write_atomic(path, write, overwrite=overwrite)


def write_bytes_atomic(
    path: str | os.PathLike[str], data: bytes, *, overwrite: bool = True
) -> None:
    """`tiling.runtime.atomic.write_bytes_atomic` with landcover's errors."""
    with output_errors():
        atomic.write_bytes_atomic(path, data, overwrite=overwrite)


def write_text_atomic(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", overwrite: bool = True
) -> None:
    """`tiling.runtime.atomic.write_text_atomic` with landcover's errors."""
    with output_errors():
        atomic.write_text_atomic(path, text, encoding=encoding, overwrite=overwrite)


def write_files_atomic(
    files: Sequence[tuple[str | os.PathLike[str], Writer]],
    *,
    overwrite: bool,
    modes: Mapping[Path, int | None] | None = None,
) -> None:
    """`tiling.runtime.atomic.write_files_atomic` (all or nothing) with landcover's errors."""
    with output_errors():
        atomic.write_files_atomic(files, overwrite=overwrite, modes=modes)


def publish(
    tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, overwrite: bool
) -> None:
    """`tiling.runtime.atomic.publish` (a finished temp file put in place) with landcover's
    errors."""
    with output_errors():
        atomic.publish(tmp, target, overwrite=overwrite)


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


def _holds(directory: str, path: str) -> bool:
    """Whether the output `directory` (a trailing slash, or an existing local directory)
    holds `path`, at any depth."""
    from tiling.runtime.urls import is_local, local_path

    if not (is_local(directory) and is_local(path)):
        return directory.endswith("/") and path.startswith(directory)
    folder = local_path(directory)
    if not (directory.endswith("/") or folder.is_dir()):
        return False
    try:
        return local_path(path).resolve().is_relative_to(folder.resolve())
    except OSError:
        return os.path.abspath(path).startswith(os.path.abspath(folder) + os.sep)


def _same_file(a: str, b: str) -> bool:
    from tiling.runtime.urls import is_local, local_path  # zarr and fsspec: only when comparing

    if not (is_local(a) and is_local(b)):
        return a.rstrip("/") == b.rstrip("/")
    first, second = local_path(a), local_path(b)
    try:
        if first.resolve() == second.resolve():
            return True
        return first.exists() and second.exists() and first.samefile(second)
    except OSError:  # a symlink loop, an unreadable directory: compared as written
        return os.path.abspath(first) == os.path.abspath(second)


def output_directory(
    out_dir: str | os.PathLike[str],
    *,
    fix: str,
    error: Callable[[str], Exception] = OutputError,
    option: str = "--out",
) -> Path:
    """The directory `option` names, as a Path; refused (`error`, naming `fix`) before any
    work when it exists and is not a directory."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise error(f"{option} {out}: exists and is not a directory; {fix}")
    return out


def check_directory_output(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool,
    what: str,
    owned: Callable[[str], bool],
    option: str = "--out",
) -> set[str]:
    """Refuse the output directory `out_dir` of `option` before any work when it holds
    anything (hidden files aside) and `overwrite` is not set: a directory output is one
    product (`what`, e.g. "evaluation report"), never mixed with other files. Returns the
    names of the product's files already there (those `owned(name)` recognises), which
    `finish_directory_output` removes once the new product is in place; files of no product
    are left alone."""
    out = output_directory(out_dir, fix=f"choose another {option}", option=option)
    if not out.is_dir():
        return set()
    entries = sorted(e.name for e in out.iterdir() if not e.name.startswith("."))
    if entries and not overwrite:
        more = f" (and {len(entries) - 1} more)" if len(entries) > 1 else ""
        raise OutputExistsError(
            f"{out / entries[0]} exists{more}; {option} {out} is for one {what}: choose a new "
            f"directory, or pass --overwrite to replace the {what} there"
        )
    return {name for name in entries if owned(name)}


def finish_directory_output(
    out_dir: str | os.PathLike[str], old: Iterable[str], new: Iterable[str]
) -> None:
    """After the product's files `new` are in place in `out_dir`: remove the old product's
    files (`old`, from `check_directory_output`) that the new one does not have."""
    out = Path(out_dir)
    with output_errors():
        for name in sorted(set(old) - set(new)):
            (out / name).unlink(missing_ok=True)
