"""The `landcover` command. Thin: parse options, build a config, call the library.

Subcommands live in `landcover.cli.*` modules and are imported only when invoked, so
`landcover info` does not pay for importing torch. Errors of our packages (bad input) are
printed as one line on stderr with exit code 2, as is a file system's refusal to store a file
(full, read-only, no permission); anything else is a bug and still gets one line (exit 3)
unless `-v` asks for the traceback.

The process, whatever the command:
- SIGTERM (a scheduler's cancel, `kill`, a container stop) raises `Terminated` in the main
  thread, so every `finally` and context manager removes its temp files; exit 143, one line.
- A reader that closes the pipe (`landcover info store | head -1`) ends the command quietly
  with exit 141, as if SIGPIPE had killed it, instead of a BrokenPipeError.
- Warnings of the libraries (rasterio's NotGeoreferencedWarning, torch's UserWarning) go
  through logging as one line each; `-v` adds where they were raised.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import select
import signal
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

import click

from cluster.errors import ClusterError
from cluster.failures import record_worker_error
from cluster.redact import Redactor
from landcover.errors import LandcoverError
from landcover.markup import terminal_text
from landcover.warnlog import WarningLogger
from landcover.writefailures import write_failure_message
from tiling.errors import TilingError
from tiling.runtime.atomic import WRITE_FAILURE_ERRNOS

# ctx.meta keys (shared by every context of one command line; see landcover.cli.stagejob)
SUBCOMMAND_ARGS = "landcover.subcommand_args"  # the subcommand's raw arguments (as typed)
RANK_KEY = "landcover.rank"  # this process's rank, once it runs as one rank of a job
RANK_SECRETS_KEY = "landcover.rank_secrets"  # values its error line must not show

USER_ERRORS: tuple[type[BaseException], ...] = (TilingError, LandcoverError, ClusterError)

# name → "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "synth": "landcover.cli.tiling:synth_command",
    "tile": "landcover.cli.tiling:tile_command",
    "info": "landcover.cli.info:info_command",
    "train": "landcover.cli.train:train_command",
    "cluster": "landcover.cli.cluster:cluster_group",
    "scale": "landcover.cli.scale:scale_command",
    "report": "landcover.cli.report:report_group",
    "predict": "landcover.cli.predict:predict_command",
    "evaluate": "landcover.cli.evaluate:evaluate_command",
    "sample": "landcover.cli.sample:sample_command",
    "change": "landcover.cli.change:change_command",
    "export": "landcover.cli.export:export_command",
    "demo": "landcover.cli.demo:demo_command",
    "tune": "landcover.cli.tune:tune_command",
    "models": "landcover.cli.models:models_command",
    "view": "landcover.cli.view:view_command",
}

# Commands no user types, left out of --help and the reference: the one entry point of every
# rank of a tile or predict job (`python -m landcover stage-rank URL`, landcover.stagerun).
HIDDEN_COMMANDS: dict[str, str] = {
    "stage-rank": "landcover.cli.stagerank:stage_rank_command",
}

SHORT_HELP: dict[str, str] = {
    "synth": "Write synthetic NAIP-like scenes and Chesapeake labels.",
    "tile": "Cut GeoTIFFs into a sharded Zarr v3 chip store.",
    "info": "Describe a chip store.",
    "train": "Train a segmentation model on a chip store (DDP).",
    "cluster": "Plan or launch training on the cluster in cluster.json.",
    "scale": "Train at several worker counts for a scaling curve.",
    "report": "Reports from training runs (scaling curves).",
    "predict": "Predict a land-cover COG for a region.",
    "evaluate": "Score a land-cover raster against truth or a labelled sample.",
    "sample": "Draw a stratified random sample of a map for labelling.",
    "change": "Change between two maps: transitions in km², gains, losses.",
    "export": "Export a model to ONNX or TorchScript, metadata inside.",
    "demo": "Run the whole pipeline on generated data.",
    "tune": "Search training options with Optuna (trials are training runs).",
    "models": "List the models --model takes, with parameter counts.",
    "view": "Write a page showing land-cover maps over their imagery.",
}


EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, what a shell reports for a process SIGTERM killed
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # 141


class Terminated(SystemExit):
    """SIGTERM arrived. A SystemExit, not an Exception: `except Exception` blocks let it pass
    and only cleanup (`finally`, `with`) runs on its way out."""

    def __init__(self) -> None:
        super().__init__(EXIT_SIGTERM)


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` in the main thread. A second SIGTERM is
    ignored while the first one's cleanup runs (SIGKILL still ends the process). Does nothing
    outside the main thread, where Python cannot install signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class TerminalFormatter(logging.Formatter):
    """Log records as lines for a terminal: within each line, the characters a terminal acts
    on (an escape sequence, a carriage return, a bidirectional override in a file name) are
    escaped as `landcover.markup.terminal_text` does; the record's own line breaks stay."""

    def format(self, record: logging.LogRecord) -> str:
        if record.args:  # the values, escaped whole: a line break in a name starts no line
            record = logging.makeLogRecord({**record.__dict__, "args": _escaped(record.args)})
        return "\n".join(terminal_text(line) for line in super().format(record).split("\n"))


def _escaped(args: Any) -> Any:
    """A log record's arguments with each text (a str or a path) escaped for a terminal."""
    if isinstance(args, dict):
        return {key: _escaped((value,))[0] for key, value in args.items()}
    return tuple(
        terminal_text(os.fspath(a)) if isinstance(a, (str, os.PathLike)) else a for a in args
    )


def log_warnings(*, verbose: bool) -> None:
    """Send `warnings.warn` through the `py.warnings` logger as one line each (the file and
    line too with `verbose`). Like logging.captureWarnings, lasts until the interpreter exits
    (or a warnings.catch_warnings block ends)."""
    warnings.showwarning = WarningLogger(logging.getLogger("py.warnings"), verbose=verbose)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reading end is closed: a BrokenPipeError
    from anything else (a socket to storage, a child process) is a real error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(mask & select.POLLERR for _, mask in events)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again (the
    recipe of the Python docs for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name) or HIDDEN_COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        # the values the user typed, escaped where an error line shows them (terminal_line)
        ctx.meta[SUBCOMMAND_ARGS] = list(rest)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SHORT_HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            _leave_rank_error(ctx, str(exc), bad_input=True)
            raise UserFacingError(_storage_source_named(ctx, str(exc)), exit_code=2) from exc
        except KeyboardInterrupt:
            raise UserFacingError("interrupted", exit_code=130) from None
        except Terminated:
            raise UserFacingError("terminated (SIGTERM)", exit_code=EXIT_SIGTERM) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
                _silence_stdout()
                raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
            if isinstance(exc, OSError) and exc.errno in WRITE_FAILURE_ERRNOS:
                message = refused_by_file_system(exc)
                _leave_rank_error(ctx, message, bad_input=True)
                raise UserFacingError(message, exit_code=2) from exc
            refusal = storage_refusal(exc)
            if refusal is not None:
                _leave_rank_error(ctx, refusal, bad_input=True)
                raise UserFacingError(_storage_source_named(ctx, refusal), exit_code=2) from exc
            _leave_rank_error(ctx, f"internal error: {type(exc).__name__}: {exc}")
            if ctx.obj and ctx.obj.get("verbose", 0) > 0:
                raise
            raise UserFacingError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with -v for the traceback)",
                exit_code=3,
            ) from exc


def refused_by_file_system(exc: OSError) -> str:
    """The one line for a file system's refusal (full, read-only, no permission) that no
    writer of ours turned into an error naming its output, e.g. an append to a log: the path
    and the fix."""
    path = exc.filename or "a file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path}: {exc.strerror or 'permission denied'}; check its permissions"
    return write_failure_message(path, exc)


# How libraries that do their own writing (SQLite under tune's study, GDAL's block writes
# under predict's COGs) word a file system's refusal, lower-cased.
_FULL_DISK_TEXTS = ("no space left on device", "database or disk is full", "disk quota exceeded")
_READ_ONLY_TEXTS = ("read-only file system", "attempt to write a readonly database")


def storage_refusal(exc: BaseException) -> str | None:
    """The one line for a full or read-only file system that reached us as another library's
    error rather than an OSError (SQLite's "database or disk is full", GDAL's "No space left
    on device"), found anywhere in the exception's chain; None when it is no such refusal."""
    from tiling.runtime.urls import exception_chain  # imports zarr: only on this error path

    for error in exception_chain(exc):
        said = (str(error).splitlines() or [""])[0]
        text = said.lower()
        if any(t in text for t in _FULL_DISK_TEXTS):
            return f"the disk is full ({said}); free space there or choose another output"
        if any(t in text for t in _READ_ONLY_TEXTS):
            return f"the output is on a read-only file system ({said}); choose another output"
    return None


def _storage_source_named(ctx: click.Context, message: str) -> str:
    """`message`, saying where --storage-options came from when it names them and they came
    from $LANDCOVER_STORAGE_OPTIONS rather than the command line. Not in a rank: its
    launcher passes the user's options to it in that variable, and says it for the job."""
    from landcover.options import STORAGE_OPTIONS_ENV, STORAGE_OPTIONS_FROM_ENV

    first = (message.splitlines() or [""])[0]
    if "--storage-options" not in first or RANK_KEY in ctx.meta:
        return message
    if not ctx.meta.get(STORAGE_OPTIONS_FROM_ENV):
        return message
    return (
        f"{first} (--storage-options came from ${STORAGE_OPTIONS_ENV} in the environment: "
        "fix or unset it there)"
    )


def terminal_line(message: str, typed: Iterable[str] = ()) -> str:
    """The one line shown for `message`: its first line, with every character that a
    terminal would act on escaped (`landcover.markup.terminal_text`). A value the user typed
    (`typed`: the command's arguments, an `--opt=value`'s value too) is escaped where it
    appears before the line is cut, so a line break inside a file name neither ends the
    message there nor starts a line of its own."""
    values = {v for arg in typed for v in (arg, arg.partition("=")[2]) if v}
    for value in sorted(values, key=len, reverse=True):
        shown = terminal_text(value)
        if shown != value:
            message = message.replace(value, shown)
    return terminal_text((message.splitlines() or [""])[0])


def _leave_rank_error(ctx: click.Context, message: str, *, bad_input: bool = False) -> None:
    """A rank of a tile/predict job leaves its one-line error for the launcher that started
    it (`cluster.failures`), storage secrets scrubbed (an fsspec error may quote them);
    `bad_input`: one of our errors about the input, not a crash."""
    if RANK_KEY not in ctx.meta:
        return
    secrets = ctx.meta.get(RANK_SECRETS_KEY) or set()
    record_worker_error(
        Redactor(secrets).text(message), rank=ctx.meta[RANK_KEY], bad_input=bad_input
    )


class UserFacingError(click.ClickException):
    """One line on stderr, no traceback: the message's first line, user values in it as text
    (`terminal_line`)."""

    def __init__(self, message: str, *, exit_code: int) -> None:
        ctx = click.get_current_context(silent=True)
        typed = ctx.meta.get(SUBCOMMAND_ARGS, ()) if ctx is not None else ()
        super().__init__(terminal_line(message, typed) if message else "error")
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def quiet_libtiff() -> None:
    """Silence libtiff's process-wide error and warning handlers, which print straight to
    stderr: GDAL (3.7+, with libtiff 4.5+) handles libtiff's messages per file, but its own
    I/O callbacks report through the process-wide ones ("_tiffSeekProc: File too large."
    under ulimit -f or on a full disk). GDAL still reports the failure as its own error, which
    becomes the command's one line. Done once rasterio is imported (set before its GDAL is
    loaded, the handlers are not the ones GDAL's libtiff uses), so commands that never read a
    raster do not pay rasterio's import."""
    if "rasterio" in sys.modules:
        _silence_libtiff()
    elif not any(isinstance(finder, _AfterRasterio) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterRasterio())


def _silence_libtiff() -> None:
    """Set the handlers of the libtiff that rasterio's GDAL uses (its wheel's copy, else the
    system's) to none."""
    import ctypes
    import ctypes.util
    import glob
    import importlib.util

    spec = importlib.util.find_spec("rasterio")
    locations = (spec.submodule_search_locations or []) if spec else []
    paths = [
        path
        for location in locations
        for path in sorted(glob.glob(os.path.join(location + ".libs", "libtiff*.so*")))
    ]
    if not paths:
        system = ctypes.util.find_library("tiff")
        paths = [system] if system else []
    for path in paths:
        try:
            libtiff = ctypes.CDLL(path)
            libtiff.TIFFSetErrorHandler(None)
            libtiff.TIFFSetWarningHandler(None)
        except (OSError, AttributeError):
            continue


class _AfterRasterio(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when rasterio is imported, wraps its loader so that libtiff's
    handlers are silenced right after (`quiet_libtiff`), then steps out of sys.meta_path."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "rasterio":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _silence_libtiff()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
@click.version_option(package_name="landcover")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """landcover: aerial imagery to land-cover maps at scale."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    ctx.obj["quiet"] = quiet
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TerminalFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    log_warnings(verbose=verbose > 0)
    # GDAL's own words (its errors at INFO, libtiff's on stderr) only with -v: without it,
    # they came before the one line that says what failed
    logging.getLogger("rasterio").setLevel(logging.NOTSET if verbose else logging.WARNING)
    if not verbose:
        quiet_libtiff()
    # Installed here, in the group's callback, so that it covers every subcommand and a
    # Terminated raised by it passes through LazyGroup.invoke's one-line mapping.
    ctx.with_resource(terminate_on_sigterm())


if __name__ == "__main__":  # pragma: no cover
    main()
