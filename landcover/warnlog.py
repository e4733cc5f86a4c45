"""Python warnings as one log line each: the one format the CLI, the workers and prediction use.

The default `warnings.showwarning` prints the message and the offending source line raw on
stderr, bypassing `-q` and the log format; libraries (rasterio, torch) warn that way.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True, slots=True)
class WarningLogger:
    """A `warnings.showwarning` replacement that logs `Category: first line of the message`
    at WARNING, plus `(file:line)` when `verbose`."""

    logger: logging.Logger
    verbose: bool = False

    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = next((part for part in str(message).splitlines() if part.strip()), "")
        where = f" ({filename}:{lineno})" if self.verbose else ""
        self.logger.warning("%s: %s%s", category.__name__, text.strip(), where)


@contextmanager
def warnings_logged(
    logger: logging.Logger, *, ignore: tuple[type[Warning], ...] = ()
) -> Iterator[None]:
    """Within the block, warnings go to `logger` as one line each; `ignore` drops categories
    that a caller answers with its own error anyway."""
    with warnings.catch_warnings():
        for category in ignore:
            warnings.simplefilter("ignore", category)
        warnings.showwarning = WarningLogger(logger)
        yield
