"""What a unit of work raised on a Dask worker, carried back to the client as it was raised.

Dask sends a task's exception to the client pickled with its whole cause chain (tblib); a
chain that does not pickle (a GDAL error, an open file in a cause) arrives as a bare
`Exception("SourceFormatError('...')")`, which reads as an internal error, and the worker logs
it with its traceback, then retries it, though bad input fails the same way every time.
`run_capturing` runs the unit and returns what it raised as a `TaskFailure` result instead:
the exception itself (without its traceback), each cause that pickles, and the worker's
traceback as text. `TaskFailure.exception()` rebuilds it on the client, where it reaches the
caller (and the CLI's one error mapping) as the very exception one process raises; the
worker's traceback goes with it as a note, which a traceback (`-v`) shows and the one-line
message does not. Dask's own retries are left for what they are for: a worker lost while it
ran the unit.

No Dask import at module level: the workers unpickle this module.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R")


class RemoteTaskError(RuntimeError):
    """An exception a task raised that could not travel to the client as itself (it does not
    pickle); its message is `TypeName: message` of the original."""


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """What one task raised: `error` (None when it did not pickle), its causes, outermost
    first (a `RemoteTaskError` with its words for each that did not pickle: callers look for
    a full disk in the causes' text), the original's type name and message, where it ran, and
    the worker's traceback text."""

    error: BaseException | None
    causes: tuple[BaseException, ...]
    type_name: str
    message: str
    where: str
    traceback_text: str

    @classmethod
    def of(cls, exc: BaseException, *, where: str) -> TaskFailure:
        """The failure `exc`, raised in `where` (a task key and a worker)."""
        return cls(
            error=_portable(exc),
            causes=tuple(_portable(c) or _stand_in(c) for c in _causes(exc)),
            type_name=type(exc).__name__,
            message=str(exc),
            where=where,
            traceback_text="".join(traceback.format_exception(exc)),
        )

    def exception(self) -> BaseException:
        """The exception to raise here: the original (its causes linked again), or a
        `RemoteTaskError` naming it; the worker's traceback is a note on it."""
        error = self.error
        if error is None:
            error = RemoteTaskError(f"{self.type_name}: {self.message}")
        outer = error
        for cause in self.causes:
            outer.__cause__ = cause
            outer = cause
        error.add_note(f"raised in {self.where}:\n{self.traceback_text.rstrip()}")
        return error


def run_capturing(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R | TaskFailure:
    """`fn(*args, **kwargs)`, or the `TaskFailure` of the Exception it raised (a
    BaseException, such as a worker being shut down, still propagates)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return TaskFailure.of(exc, where=_this_task())


def raise_failure(result: object) -> None:
    """Raise what the task raised if `result` is a `TaskFailure`; else nothing."""
    if isinstance(result, TaskFailure):
        raise result.exception()


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`'s causes (explicit, else implicit context), outermost first, each once."""
    seen = {id(exc)}
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _portable(exc: BaseException) -> BaseException | None:
    """A copy of `exc` that survives pickling (without traceback or causes), or None. They
    are taken off while it is pickled: Dask's tblib pickles an exception class with its
    whole chain once Dask has sent one of them."""
    saved = exc.__traceback__, exc.__cause__, exc.__context__
    exc.__traceback__ = exc.__cause__ = exc.__context__ = None
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    finally:
        exc.__traceback__, exc.__cause__, exc.__context__ = saved
    if not isinstance(copy, BaseException):
        return None
    copy.__traceback__ = None
    copy.__cause__ = copy.__context__ = None
    return copy


def _stand_in(exc: BaseException) -> RemoteTaskError:
    return RemoteTaskError(f"{type(exc).__name__}: {exc}")


def _this_task() -> str:
    """The task and worker this runs in, in words ("this process" outside a worker)."""
    try:
        from distributed import get_worker

        worker = get_worker()
        return f"Dask task {worker.get_current_task()!r} on worker {worker.address}"
    except (ImportError, AttributeError, ValueError):
        return "this process"
