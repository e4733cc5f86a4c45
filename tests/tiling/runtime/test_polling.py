"""How often a waiting rank polls: briefly on a local or mounted path, growing on blob storage."""

from __future__ import annotations

from itertools import islice

import pytest

from tiling.runtime.polling import LOCAL_COUNT_MAX_S, LOCAL_MAX_S, poll_delays


def test_a_local_path_is_polled_at_most_every_local_max_s(tmp_path: object) -> None:
    for url in (str(tmp_path), f"file://{tmp_path}", "relative/store.zarr"):
        delays = list(islice(poll_delays(url, 0.05, 1.0), 20))
        assert max(delays) == LOCAL_MAX_S
        assert delays[0] < LOCAL_MAX_S  # it still starts faster than its cap
    counts = list(islice(poll_delays(str(tmp_path), 0.02, 0.5, local_max_s=LOCAL_COUNT_MAX_S), 9))
    assert counts[0] == 0.01 and max(counts) == LOCAL_COUNT_MAX_S


def test_blob_storage_polls_slow_down_to_the_cap() -> None:
    delays = list(islice(poll_delays("az://container/store.zarr", 0.05, 1.0), 8))
    assert delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert delays[5:] == [1.0, 1.0, 1.0]
    grown = list(islice(poll_delays("az://c/s", 0.1, 5.0, growth=1.5), 3))
    assert grown == pytest.approx([0.1, 0.15, 0.225])


@pytest.mark.parametrize(
    ("first", "cap", "growth"), [(0.0, 1.0, 2.0), (1.0, 0.5, 2.0), (0.1, 1.0, 0.5)]
)
def test_a_schedule_that_does_not_grow_is_refused(first: float, cap: float, growth: float) -> None:
    with pytest.raises(ValueError, match="does not grow"):
        poll_delays("az://c/s", first, cap, growth)
