"""Waiting for what other ranks stage: poll the folder until it is there.

Ranks share no process group and file systems have no change notification that works across
machines, so a reader looks again on a schedule (`PollSchedule`, the delays of
`tiling.runtime.polling`: short on a local or mounted path, growing on blob storage where each look
is a billed request). A wait has no timeout of its own unless its caller gives it one
(`give_up`): when a rank dies, the engine stops the others, and the rerun resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tiling.runtime.polling import LOCAL_MAX_S, poll_delays
from tiling.staged.folder import StagedFolder

K = TypeVar("K")
R = TypeVar("R")

WAIT_LOG_EVERY_S = 60.0  # a waiting rank says what it waits for this often


@dataclass(frozen=True, slots=True)
class PollSchedule:
    """How often a reader looks again: from `first_s`, times `growth` each time, up to
    `max_s`; on a local or mounted path at most `local_max_s`
    (`tiling.runtime.polling.poll_delays`)."""

    first_s: float
    max_s: float
    growth: float = 2.0
    local_max_s: float = LOCAL_MAX_S

    def delays(self, url: str) -> Iterator[float]:
        """Seconds to sleep before each next look at `url` (endless)."""
        return poll_delays(url, self.first_s, self.max_s, self.growth, local_max_s=self.local_max_s)


def poll(
    find: Callable[[], R | None],
    *,
    url: str,
    schedule: PollSchedule,
    check: Callable[[], None] = lambda: None,
    give_up: Callable[[], bool] = lambda: False,
    waiting: Callable[[float], None] | None = None,
) -> R | None:
    """What `find()` returns once it is not None, looking in `url` on `schedule`; None once
    `give_up()` says so first. Between looks `check()` may raise to abandon the wait, and
    `waiting(seconds waited)` is called every WAIT_LOG_EVERY_S (to log what is awaited)."""
    start = logged = time.perf_counter()
    delays = schedule.delays(url)
    while True:
        found = find()
        if found is not None:
            return found
        check()
        if give_up():
            return None
        now = time.perf_counter()
        if waiting is not None and now - logged >= WAIT_LOG_EVERY_S:
            waiting(now - start)
            logged = now
        time.sleep(next(delays))


def wait_until(
    find: Callable[[], R | None],
    *,
    url: str,
    schedule: PollSchedule,
    check: Callable[[], None] = lambda: None,
    waiting: Callable[[float], None] | None = None,
) -> R:
    """`poll` without a timeout: what `find()` returns once it is not None (`check()` may
    still raise to abandon the wait)."""
    found = poll(find, url=url, schedule=schedule, check=check, waiting=waiting)
    if found is None:  # cannot happen: without give_up, poll returns only what it found
        raise RuntimeError(f"waiting in {url} ended with nothing found")
    return found


def wait_for_records(
    folder: StagedFolder,
    names: Mapping[K, str],
    read: Callable[[K], R | None],
    *,
    schedule: PollSchedule,
    under: str = "",
    waiting: Callable[[float, list[K]], None] | None = None,
) -> dict[K, R]:
    """The committed record of every part of `names` (part → its record's file name in
    `folder`, or in its subfolder `under`), once all are there: each look lists the folder
    once and reads only the records that appeared. `read(part)` gives a record that checks
    out, else None (the wait goes on). `waiting(seconds, parts still awaited)` is called
    every WAIT_LOG_EVERY_S."""
    pending = dict(names)
    found: dict[K, R] = {}

    def look() -> dict[K, R] | None:
        present = folder.names(under)
        for part, name in list(pending.items()):
            if name in present and (record := read(part)) is not None:
                found[part] = record
                del pending[part]
        return found if not pending else None

    def report(seconds: float) -> None:
        if waiting is not None:
            waiting(seconds, list(pending))

    return wait_until(look, url=folder.url, schedule=schedule, waiting=report)
