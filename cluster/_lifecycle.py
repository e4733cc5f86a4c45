"""A context manager over `start()` and `stop()`, for what the cluster package brings up and
must tear down whatever happens (emulated networks, the SLURM testbed)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Started:
    """`with thing:` starts it and always stops it; subclasses define `start` and `stop`."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
