"""Rank 0's hand-over of its own parts from its cutting thread to its commit (tiling.ranks)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.tiling.test_parts import sample_part
from tiling.commit import PendingSource
from tiling.parts import PartStaging, SourcePart
from tiling.plan import SourcePlan
from tiling.ranks import StageItem, _OwnParts, stage_sources


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
