"""The per-source records of format version 3: out of the group attribute, one object each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zarr
from zarr.storage import LocalStore

import tiling.chipstore.resume
from tests.support.chipstores import chips, small_params, snapshot, write_source
from tiling.chipstore.resume import open_writer
from tiling.chipstore.source_table import read_records
from tiling.chipstore.store import ATTRS_KEY, open_store
from tiling.errors import StoreCorruptError

SOURCES = 200


def test_a_commit_writes_as_much_at_the_200th_source_as_at_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit writes the chips, one record and the group attribute, which grows only by
    the source's chip count: with the records in it (format version 2) it grew by a whole
    record, ~500 bytes here and ~3 KB for a NAIP file, so the writes grew with the store."""
    written: list[tuple[str, int]] = []
    real_set = LocalStore.set

    async def spy(self: LocalStore, key: str, value: Any) -> None:
        written.append((key, len(value.to_bytes())))
        await real_set(self, key, value)

    monkeypatch.setattr(LocalStore, "set", spy)
    url = str(tmp_path / "many.zarr")
    writer = open_writer(url, small_params(tuple(f"s{k}" for k in range(SOURCES))))
    per_commit: list[dict[str, int]] = []
    for k in range(SOURCES):
        written.clear()
        write_source(writer, k, chips(1, seed=k))
        per_commit.append(dict(written))
    for k, objects in enumerate(per_commit):
        assert f"sources/c/{k}" in objects and "zarr.json" in objects
    growth = per_commit[-1]["zarr.json"] - per_commit[0]["zarr.json"]
    assert growth < 16 * SOURCES, growth  # the chip counts, one short line each
    record_bytes = [objects[f"sources/c/{k}"] for k, objects in enumerate(per_commit)]
    assert max(record_bytes) < 2 * min(record_bytes)
    writer.finish()
    store = open_store(url)
    assert [s.id for s in store.summary.sources] == list(range(SOURCES))
    assert store.summary.num_chips == SOURCES
    table = zarr.open_array(str(tmp_path / "many.zarr" / "sources"), mode="r")
    assert table.shape == (SOURCES,)  # the spare capacity is cut when the store completes


def test_a_lost_record_fails_the_open_naming_it_and_the_fix(tmp_path: Path) -> None:
    url = str(tmp_path / "lost.zarr")
    writer = open_writer(url, small_params(("s0", "s1", "s2")))
    for k in range(3):
        write_source(writer, k, chips(4, seed=k))
    writer.finish()
    (tmp_path / "lost.zarr" / "sources" / "c" / "1").unlink()
    with pytest.raises(StoreCorruptError) as caught:
        open_store(url)
    assert str(caught.value) == (
        f"{url}: source record 1 is missing or unreadable (group attribute {ATTRS_KEY!r} "
        "counts more done sources); the store is damaged, re-tile with: landcover tile <the "
        f"same inputs and options> --out {url} --overwrite"
    )


def test_a_record_past_the_commit_point_is_never_read_and_a_resume_rewrites_it(
    tmp_path: Path,
) -> None:
    """A run that died between writing source 1's record and the attribute counting it: the
    store reads as one source, and the resumed store is byte for byte an uninterrupted one."""
    params = small_params(("s0", "s1"))
    whole, died = str(tmp_path / "whole.zarr"), str(tmp_path / "died.zarr")
    writer = open_writer(whole, params)
    write_source(writer, 0, chips(7, seed=0))
    write_source(writer, 1, chips(4, seed=1))
    writer.finish()
    writer = open_writer(died, params)
    write_source(writer, 0, chips(7, seed=0))
    write_source(writer, 1, chips(9, seed=5))  # other chips than the run that resumes
    group = zarr.open_group(died, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
    group.update_attributes({ATTRS_KEY: {**meta, "source_chips": "7", "num_chips": 7}})
    assert [s.id for s in open_store(died).summary.sources] == [0]
    assert read_records(group, 2, died)[1].chips == 9  # there, but past the commit point
    writer = open_writer(died, params)
    assert [s.id for s in writer.done_sources] == [0]
    write_source(writer, 1, chips(4, seed=1))
    writer.finish()
    assert snapshot(died, {}) == snapshot(whole, {})


def test_a_run_that_died_before_creating_its_arrays_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group attribute is written first; a run that died right after it left no
    `sources` array, and the rerun creates it (with the label fingerprints of now: nothing
    was tiled from earlier ones)."""
    params = small_params(("s0",))
    url = str(tmp_path / "early.zarr")

    def die(*args: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(tiling.chipstore.resume, "create_source_table", die)
        with pytest.raises(KeyboardInterrupt):
            open_writer(url, params)
    assert not (tmp_path / "early.zarr" / "sources").exists()
    writer = open_writer(url, params)
    write_source(writer, 0, chips(3, seed=0))
    writer.finish()
    fresh = str(tmp_path / "fresh.zarr")
    writer = open_writer(fresh, params)
    write_source(writer, 0, chips(3, seed=0))
    writer.finish()
    assert snapshot(url, {}) == snapshot(fresh, {})
    record = json.loads(str(zarr.open_array(f"{url}/sources", mode="r")[0]))
    assert record["chips"] == 3


def test_a_damaged_commit_point_fails_the_open_with_the_fix(tmp_path: Path) -> None:
    url = str(tmp_path / "odd.zarr")
    writer = open_writer(url, small_params(("s0",)))
    write_source(writer, 0, chips(2, seed=0))
    writer.finish()
    group = zarr.open_group(url, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
    group.update_attributes({ATTRS_KEY: {**meta, "source_chips": "2 two"}})
    with pytest.raises(StoreCorruptError, match=r"source_chips is not a list of numbers: '2 two'"):
        open_store(url)
