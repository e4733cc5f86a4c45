"""Rank 0's hand-over of its own parts from its cutting thread to its commit
(tiling.tiler.ranks)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.chipstores import sample_part, small_params
from tiling.tiler.commit import PendingSource
from tiling.tiler.parts import SourcePart, run_key
from tiling.tiler.plan import SourcePlan
from tiling.tiler.ranks import StageItem, _OwnParts, stage_sources
from tiling.tiler.stager import Starts
from tiling.tiler.staging import PartStaging


def test_a_reused_own_part_is_held_so_the_commit_reads_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = PartStaging(str(tmp_path / "s.zarr"))
    part = sample_part()
    staging.put(part)  # staged by an earlier, interrupted run
    reads: list[int] = []
    real_get = PartStaging.get

    def get(self: PartStaging, source_id: int, key: str) -> SourcePart | None:
        reads.append(source_id)
        return real_get(self, source_id, key)

    monkeypatch.setattr(PartStaging, "get", get)
    source = SimpleNamespace(
        id=part.source_id, image=SimpleNamespace(path="a.tif"), grid=SimpleNamespace(num_chips=3)
    )
    own = _OwnParts(staging)

    def cut(source: Any) -> Any:
        raise AssertionError("a staged part that checks out is not cut again")

    cut_count = stage_sources(
        [StageItem(cast(SourcePlan, source), part.key)],
        staging,
        cut,
        num_classes=3,
        keep=own.keep,
        ready=own.ready,
    )
    pending = cast(PendingSource, SimpleNamespace(record=SimpleNamespace(id=7), key=part.key))
    taken, read_s = own.take(pending)
    assert cut_count == 0 and reads == [7] and read_s == 0.0
    assert (taken.images, taken.labels, taken.totals) == (part.images, part.labels, part.totals)


def test_a_start_row_adds_the_counts_before_it_published_or_done(tmp_path: Path) -> None:
    """Counts of 20 earlier sources, read many at once: 3 done in the store, the rest
    published by their owners; a count not yet published keeps the wait going."""
    staging = PartStaging(str(tmp_path / "s.zarr"))
    params = small_params(("s",))
    for j in range(3, 20):
        staging.put_count(j, run_key(params), j)
    starts = Starts(staging, params, done_chips=lambda: [100, 200, 300])
    assert starts.wait(20) == 600 + sum(range(3, 20))
    assert starts.wait(21, give_up=lambda: True) is None  # source 20's count never came
