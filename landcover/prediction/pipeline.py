"""Three stages over a sequence of items, overlapped in three threads: a reader thread
prepares items ahead, the calling thread processes them in order, a writer thread finishes
the results behind it.

Prediction runs its blocks through it (`landcover.prediction.blockstages`): GDAL releases the
GIL while it reads and writes, torch while it computes, so reading the next block and writing
the last one cost little besides the model's time. Queues of `depth` items bound the memory:
at most `depth` + 1 prepared items wait ahead of the one being processed, and `depth` + 2
results behind it (one of them being written), whatever the number of items.

Errors: the error a one-thread run would raise is raised in the calling thread, once both
threads have stopped (none is left behind): the writer finishes the items it holds, and an
item's error comes before any later item's. A KeyboardInterrupt or SystemExit in the calling
thread (Ctrl-C, the CLI's SIGTERM) stops both threads at once (after the read or write under
way) and goes on up, so the caller's clean-up (temporary files) runs after the threads have
let go of the files.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Prepared = TypeVar("Prepared")
Result = TypeVar("Result")

# How often a thread blocked on a full or empty queue looks whether the others have stopped.
_POLL_S = 0.05


class _End:
    """Put after the last item."""


class _Failed:
    """A stage's error, passed on in item order."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def run_pipeline(
    items: Iterable[Item],
    prepare: Callable[[Item], Prepared],
    process: Callable[[Prepared], Result],
    finish: Callable[[Result], None],
    *,
    depth: int = 1,
    threaded: bool = True,
) -> None:
    """`finish(process(prepare(item)))` for each item in order: `prepare` (and the iteration
    of `items`) in a reader thread, `process` here, `finish` in a writer thread.

    `threaded=False` runs the three one after another here (the reference the threads must
    equal). Raises the first error of any stage after both threads have stopped.
    """
    if depth < 1:
        raise ValueError(f"pipeline depth {depth}: must be at least 1")  # a bug
    if not threaded:
        for item in items:
            finish(process(prepare(item)))
        return
    _Pipeline(items, prepare, process, finish, depth).run()


class _Pipeline(Generic[Item, Prepared, Result]):
    def __init__(
        self,
        items: Iterable[Item],
        prepare: Callable[[Item], Prepared],
        process: Callable[[Prepared], Result],
        finish: Callable[[Result], None],
        depth: int,
    ) -> None:
        self.items, self.prepare, self.process, self.finish = items, prepare, process, finish
        self.stop_reading = threading.Event()
        self.stop_writing = threading.Event()
        self.ahead: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.behind: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.writer_error: BaseException | None = None
        self.reader = threading.Thread(target=self._read, name="predict-read", daemon=True)
        self.writer = threading.Thread(target=self._write, name="predict-write", daemon=True)

    def run(self) -> None:
        self.reader.start()
        self.writer.start()
        try:
            try:
                while True:
                    prepared = self._next_prepared()
                    if isinstance(prepared, _End):
                        break
                    if isinstance(prepared, _Failed):
                        raise prepared.error
                    self._hand_to_writer(self.process(prepared))
            except Exception:
                # A one-thread run would have finished every earlier item first: the writer
                # finishes those it holds, and its error, from an earlier item, wins.
                self._finish_writing()
                raise
            self._finish_writing()
        finally:
            # Also on an interrupt (Ctrl-C, SIGTERM), which needs no more writing.
            self.stop_reading.set()
            self.stop_writing.set()
            self.reader.join()
            self.writer.join()

    def _next_prepared(self) -> Any:
        while True:
            try:
                return self.ahead.get(timeout=_POLL_S)
            except queue.Empty:
                self._raise_writer_error()
                if not self.reader.is_alive() and self.ahead.empty():
                    raise RuntimeError("the pipeline's reader stopped without a word") from None

    def _hand_to_writer(self, result: Any) -> None:
        while True:
            self._raise_writer_error()
            try:
                self.behind.put(result, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _finish_writing(self) -> None:
        """Let the writer finish what it holds, wait for it, and raise its error if any."""
        self.stop_reading.set()
        while self.writer.is_alive():
            try:
                self.behind.put(_End(), timeout=_POLL_S)
                break
            except queue.Full:
                continue
        self.writer.join()
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self.writer_error is not None:
            raise self.writer_error

    def _read(self) -> None:
        try:
            for item in self.items:
                prepared = self.prepare(item)
                if not self._put_ahead(prepared):
                    return
        except BaseException as exc:  # handed to the calling thread, in item order
            self._put_ahead(_Failed(exc))
            return
        self._put_ahead(_End())

    def _put_ahead(self, value: Any) -> bool:
        while not self.stop_reading.is_set():
            try:
                self.ahead.put(value, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _write(self) -> None:
        while not self.stop_writing.is_set():
            try:
                result = self.behind.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if isinstance(result, _End) or self.stop_writing.is_set():
                return
            try:
                self.finish(result)
            except BaseException as exc:  # raised in the calling thread
                self.writer_error = exc
                return
