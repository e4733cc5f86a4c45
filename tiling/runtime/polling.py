"""How often a rank looks again for what another rank writes to shared storage.

Ranks wait on each other by polling: file systems have no change notification that works
across NFS clients, and blob storage has none at all. What a poll costs depends on where it
looks. On a local or mounted path it is one failed open or one directory listing
(microseconds; one round trip on NFS), so a single waiter looks every LOCAL_MAX_S and finds
what it waits for at most that late. A rank waiting for the chip counts before its source
looks every LOCAL_COUNT_MAX_S: all ranks of a job may wait at once, and on NFS 256 of them
make a few thousand lookups a second at that rate. On blob storage a poll is a billed
request, so the delay grows from `first_s` by `growth` up to `max_s`: a long wait may end
late, but only after a long wait. The blob schedule on a local path would find the last
part of a run up to a second late, when nothing else is left to do
(`benchmarks/bench_tile_ranks.py` times the wait).
"""

from __future__ import annotations

from collections.abc import Iterator

from tiling.runtime.urls import is_local

LOCAL_FIRST_S = 0.01
LOCAL_MAX_S = 0.05
LOCAL_COUNT_MAX_S = 0.1


def poll_delays(
    url: str,
    first_s: float,
    max_s: float,
    growth: float = 2.0,
    *,
    local_max_s: float = LOCAL_MAX_S,
) -> Iterator[float]:
    """Seconds to sleep before each next poll of `url` (endless): from `first_s`, times
    `growth` each time, up to `max_s`; on a local or mounted path at most `local_max_s`
    (more than LOCAL_MAX_S where every rank of a job may be waiting at once)."""
    if growth < 1.0 or first_s <= 0 or max_s < first_s or local_max_s <= 0:
        raise ValueError(f"poll schedule {first_s} s x {growth} up to {max_s} s does not grow")
    if is_local(url):
        first_s = min(first_s, LOCAL_FIRST_S, local_max_s)
        max_s = min(max_s, local_max_s)
    return _growing(first_s, max_s, growth)


def _growing(delay: float, max_s: float, growth: float) -> Iterator[float]:
    while True:
        yield delay
        delay = min(max_s, delay * growth)
