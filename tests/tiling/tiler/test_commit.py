"""Distributed tiling in the library: ranks stage parts, rank 0 commits them in input order.

Ranks run here as threads calling `tile(config, rank=r, world_size=n)` (the CLI tests run
them as processes); every store is compared object for object with a one-process run.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import tiling.tiler.commit
import tiling.tiler.cut
import tiling.tiler.ranks
import tiling.tiler.stager
import tiling.tiler.staging
from tests.support.chipstores import config, snapshot
from tests.tiling.rasters import Scenes
from tiling.chipstore.store import open_store
from tiling.errors import StoreError, TilingError
from tiling.tiler.commit import assign_sources, check_rank, stored_done_chips
from tiling.tiler.config import TileConfig
from tiling.tiler.parts import run_key
from tiling.tiler.plan import plan_tiling
from tiling.tiler.staging import PartStaging
from tiling.tiler.tile import TileResult, tile

RANK_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def four_images(scenes: Scenes, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ...]:
    """Four sources (copies of the two scenes), so ranks own several each."""
    root = tmp_path_factory.mktemp("four")
    paths = []
    for name, src in zip("abcd", [*scenes.images, *scenes.images], strict=True):
        paths.append(Path(shutil.copy(src, root / f"{name}.tif")))
    return tuple(paths)


def four_config(scenes: Scenes, images: tuple[Path, ...], out: Path | str, **kw: Any) -> TileConfig:
    labelled = {"labels": (str(scenes.nlcd),), "class_map": "nlcd", "val_fraction": 0.2}
    return config(images, out, shard_size=3, min_valid=0.3, **{**labelled, **kw})


def run_ranks(cfg: TileConfig, world_size: int) -> list[TileResult]:
    """Every rank of a run, each in a thread, as an engine would start them."""
    results: dict[int, TileResult] = {}
    errors: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        try:
            results[rank] = tile(cfg, rank=rank, world_size=world_size)
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RANK_TIMEOUT_S)
        assert not thread.is_alive(), "a rank hung"
    if errors:
        raise next(iter(errors.values()))
    return [results[r] for r in range(world_size)]


@pytest.fixture
def rank_1_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that run rank 1 without rank 0: neither the plan nor the counts before its
    sources come, so it plans the run itself and stages its parts whole after a short wait
    rather than COUNT_WAIT_S."""
    monkeypatch.setattr(tiling.tiler.stager, "COUNT_WAIT_S", 0.2)


@pytest.fixture(scope="module")
def one_process(scenes: Scenes, four_images: tuple[Path, ...], tmp_path_factory: Any) -> Path:
    out = tmp_path_factory.mktemp("one") / "one.zarr"
    tile(four_config(scenes, four_images, out))
    return out


def test_sources_are_dealt_by_planned_chips_in_input_order() -> None:
    def deal(chips: list[int], world: int) -> list[int]:
        return assign_sources(chips, world, commit_weight=0.0)

    assert deal([10, 10, 10, 10, 10], 2) == [0, 1, 0, 0, 1]  # the last swapped away from 0
    assert deal([100, 10, 10, 10, 10, 60], 2) == [0, 1, 1, 1, 1, 1]
    assert deal([5, 5], 3) == [0, 1]
    assert deal([5, 5, 5], 1) == [0, 0, 0]
    owners = deal([7, 3, 9, 1, 4, 4, 8, 2], 3)
    loads = [
        sum(c for c, o in zip([7, 3, 9, 1, 4, 4, 8, 2], owners, strict=True) if o == r)
        for r in range(3)
    ]
    assert max(loads) - min(loads) <= 9  # at most one source's chips apart


def test_rank_0_never_cuts_the_last_source_while_another_rank_cuts() -> None:
    for chips, world in (([10] * 8, 2), ([10] * 5, 2), ([3, 9, 4, 7, 5], 2), ([10] * 9, 3)):
        owners = assign_sources(chips, world)
        assert owners[-1] != 0, (chips, world, owners)
        assert owners[0] == 0  # rank 0 still cuts the first (its part is in memory at once)
    assert assign_sources([10], 2) == [0]  # nobody else cuts: rank 0 keeps it
    assert assign_sources([10, 10], 1) == [0, 0]


def test_rank_0_cuts_less_by_the_commit_it_carries() -> None:
    two = assign_sources([10] * 20, 2, commit_weight=0.25)
    assert two.count(0) < two.count(1) and two[:2] == [0, 1]
    assert 10 * two.count(0) + 0.25 * 200 == pytest.approx(10 * two.count(1), abs=10)
    many = assign_sources([10] * 64, 16, commit_weight=0.25)
    assert many.count(0) == 1  # the first source; then rank 0 only commits
    assert assign_sources([10] * 5, 1, commit_weight=0.25) == [0] * 5


@pytest.mark.parametrize(
    ("rank", "world", "message"),
    [(2, 2, "rank 2 is outside 0..1"), (-1, 2, "rank -1 is outside"), (0, 0, "at least 1")],
)
def test_a_rank_outside_the_world_is_refused(rank: int, world: int, message: str) -> None:
    with pytest.raises(TilingError, match=message):
        check_rank(rank, world)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_write_the_bytes_of_a_one_process_run(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    world_size: int,
) -> None:
    out = tmp_path / "ranks.zarr"
    results = run_ranks(four_config(scenes, four_images, out), world_size)
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    assert not Path(f"{out}.parts").exists()
    assert results[0].summary.complete and results[0].commit.parts == 4
    assert sum(r.parts_cut for r in results) == 4
    with pytest.raises(StoreError, match=r"rank 1 of .* staged its parts; rank 0 holds"):
        results[1].summary  # noqa: B018


@pytest.mark.parametrize("held", [2, 0])
def test_rank_0_commits_its_own_parts_from_memory_and_stages_only_past_its_limit(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: int,
) -> None:
    out = tmp_path / "held.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    staged: list[int] = []
    real_put = PartStaging.put

    def put(self: PartStaging, part: Any) -> None:
        staged.append(part.source_id)
        real_put(self, part)

    monkeypatch.setattr(PartStaging, "put", put)
    monkeypatch.setattr(tiling.tiler.ranks, "MAX_HELD_PARTS", held)
    run_ranks(cfg, 2)
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    own = {i for i, o in enumerate(owners) if o == 0}
    assert own and len(own) < 4
    if held:  # rank 0's own chips never travel through the staging folder
        assert set(staged) == set(range(4)) - own
    else:  # none may be held: rank 0 stages its own too and reads them back
        assert sorted(staged) == [0, 1, 2, 3]


@pytest.mark.parametrize("rerun_world", [1, 2, 3])
def test_a_rerun_after_ranks_died_equals_the_uninterrupted_store(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rerun_world: int,
    rank_1_alone: None,
) -> None:
    out = tmp_path / "killed.zarr"
    cfg = four_config(scenes, four_images, out)
    real_put, real_commit = PartStaging.put, tiling.tiler.commit.commit_part
    puts: list[int] = []

    def put_then_die(self: PartStaging, part: Any) -> None:
        real_put(self, part)
        puts.append(part.source_id)
        raise RuntimeError("rank 1 killed")

    monkeypatch.setattr(PartStaging, "put", put_then_die)
    with pytest.raises(RuntimeError, match="rank 1 killed"):
        tile(cfg, rank=1, world_size=2)  # staged source 1, died before its second
    monkeypatch.setattr(PartStaging, "put", real_put)

    def commit_then_die(*args: Any) -> Any:
        record = real_commit(*args)
        raise RuntimeError(f"rank 0 killed after committing source {record.id}")

    monkeypatch.setattr(tiling.tiler.commit, "commit_part", commit_then_die)
    with pytest.raises(RuntimeError, match="rank 0 killed after committing source 0"):
        tile(cfg, rank=0, world_size=2)
    monkeypatch.undo()
    assert puts == [1]
    assert [s.id for s in open_store(str(out)).summary.sources] == [0]
    assert len(stored_done_chips(str(out), plan_tiling(cfg).params.digest())) == 1
    results = run_ranks(cfg, rerun_world)
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    assert results[0].sources_resumed == 1
    assert sum(r.parts_cut for r in results) <= 2  # source 1's part was reused, not redone
    assert not Path(f"{out}.parts").exists()


@pytest.mark.parametrize("rerun_world", [1, 2])
def test_a_damaged_or_foreign_part_is_redone_never_trusted(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    rerun_world: int,
    rank_1_alone: None,
) -> None:
    out = tmp_path / "stale.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    rank_1 = [i for i, owner in enumerate(owners) if owner == 1]
    assert len(rank_1) == 2
    tile(cfg, rank=1, world_size=2)  # stages its two sources
    staging = Path(f"{out}.parts")
    names = sorted(p.name for p in staging.iterdir() if p.suffix == ".part")
    assert [int(n.split(".")[0]) for n in names] == rank_1
    first, second = (staging / n for n in names)
    first.write_bytes(first.read_bytes()[:-50])  # cut short
    second.write_bytes(first.read_bytes())  # the first's (damaged) bytes under the second's name
    old = staging / PartStaging.name(owners.index(0), "0" * 24)  # other options: never opened
    old.write_bytes(b"stale")
    results = run_ranks(cfg, rerun_world)
    if rerun_world == 2:
        assert results[1].parts_cut == 2  # both redone by their owner
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    assert not staging.exists()


def test_one_process_reuses_parts_and_ranks_skip_committed_sources(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rank_1_alone: None,
) -> None:
    out = tmp_path / "reuse.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    tile(cfg, rank=1, world_size=2)
    cut = spy_cuts(monkeypatch)
    result = tile(cfg)  # one process: appends rank 1's parts, cuts rank 0's sources itself
    monkeypatch.undo()
    monkeypatch.setattr(
        tiling.tiler.stager, "COUNT_WAIT_S", 0.2
    )  # rank_1_alone's, which undo() undid
    assert set(cut) == {i for i, o in enumerate(owners) if o == 0} and result.sources_written == 4
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    late = tile(cfg, rank=1, world_size=2)  # a rank that starts after the store is complete
    assert late.parts_cut == 0 and not Path(f"{out}.parts").exists()


@pytest.mark.azurite
def test_ranks_commit_to_az_urls_byte_for_byte(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    tmp_path: Path,
    azurite: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copies: list[bool] = []
    real_copy = tiling.tiler.staging.copy_blobs

    def copy_blobs(fs: Any, pairs: Any) -> bool:
        copies.append(real_copy(fs, pairs))
        return copies[-1]

    monkeypatch.setattr(tiling.tiler.staging, "copy_blobs", copy_blobs)
    options = azurite.storage_options
    one = azurite.url(f"one-{tmp_path.name}.zarr")
    two = azurite.url(f"two-{tmp_path.name}.zarr")
    tile(four_config(scenes, four_images, one, storage_options=options))
    run_ranks(four_config(scenes, four_images, two, storage_options=options), 2)
    assert snapshot(two, options) == snapshot(one, options)
    assert copies and all(copies)  # interior objects copied on the server, not through rank 0
    assert PartStaging(two, options).names() == frozenset()


def spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Source ids of the parts PartStaging.<name> is called with."""
    calls: list[int] = []
    real = getattr(PartStaging, name)

    def method(self: PartStaging, part: Any, *args: Any) -> Any:
        calls.append(part.source_id)
        return real(self, part, *args)

    monkeypatch.setattr(PartStaging, name, method)
    return calls


def test_rank_1_builds_its_interior_shard_objects_and_rank_0_moves_them_in(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "interior.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    staged, placed = spy(monkeypatch, "put_interior"), spy(monkeypatch, "place")
    run_ranks(cfg, 2)
    rank_1 = {i for i, o in enumerate(owners) if o == 1}
    assert staged and set(staged) <= rank_1 and sorted(placed) == sorted(staged)
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
    assert not Path(f"{out}.parts").exists()


def spy_cuts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Source ids of the windows this process cuts."""
    cut: list[int] = []
    real = tiling.tiler.cut._cut_window

    def cut_window(reader: Any, plan: Any, source: Any, window: Any) -> Any:
        cut.append(source.id)
        return real(reader, plan, source, window)

    monkeypatch.setattr(tiling.tiler.cut, "_cut_window", cut_window)
    return cut


def publish_rank_0_counts(
    cfg: TileConfig, one_process: Path, owners: list[int], *, extra: int = 0
) -> None:
    """The chip counts rank 0 would publish, taken from the one-process store (`extra`
    more each: counts an earlier run left for inputs that changed since)."""
    staging, key = PartStaging(cfg.out), run_key(plan_tiling(cfg).params)
    for record in open_store(str(one_process)).summary.sources:
        if owners[record.id] == 0:
            staging.put_count(record.id, key, record.chips + extra)


def test_one_process_moves_thin_parts_in_where_they_fit_and_recuts_where_not(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    rank_1_alone: None,
) -> None:
    out = tmp_path / "thin.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    publish_rank_0_counts(cfg, one_process, owners)
    tile(cfg, rank=1, world_size=2)  # counts known: thin parts beside their objects
    staging = PartStaging(str(out))
    parts = {
        int(n.split(".")[0]): staging.get(int(n.split(".")[0]), n.split(".")[1])
        for n in staging.names()
    }
    assert all(p is not None and p.interior is not None for p in parts.values())
    gone, kept = sorted(parts)
    part = parts[gone]
    assert part is not None
    name = next(n for _, _, n in staging.interior_objects(part) if n is not None)
    (Path(staging.url) / name).unlink()  # as if a commit moved it into a store, then died
    cut = spy_cuts(monkeypatch)
    placed = spy(monkeypatch, "place")
    tile(cfg)
    assert placed == [kept] and gone in cut and kept not in cut
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})


def test_a_thin_part_made_for_another_row_is_cut_again_never_placed(
    scenes: Scenes,
    four_images: tuple[Path, ...],
    one_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counts left by an earlier run whose inputs changed since: rank 1 builds its interior
    objects for the wrong rows. Rank 0 never places them: it cuts that source itself, and a
    rerun's rank 1 sees that its part does not fit the counts of the run and cuts it again."""
    out = tmp_path / "shifted.zarr"
    cfg = four_config(scenes, four_images, out)
    owners = assign_sources([s.grid.num_chips for s in plan_tiling(cfg).sources], 2)
    publish_rank_0_counts(cfg, one_process, owners, extra=1)
    monkeypatch.setattr(tiling.tiler.stager, "COUNT_WAIT_S", 0.2)
    tile(cfg, rank=1, world_size=2)
    cut = spy_cuts(monkeypatch)
    real_commit = tiling.tiler.commit.commit_part

    def commit_then_die(*args: Any) -> Any:
        record = real_commit(*args)
        if record.id == 1:
            raise RuntimeError("rank 0 killed after committing source 1")
        return record

    monkeypatch.setattr(tiling.tiler.commit, "commit_part", commit_then_die)
    with pytest.raises(RuntimeError, match="killed after committing source 1"):
        tile(cfg, rank=0, world_size=2)  # commits rank 1's source 1 by cutting it itself
    monkeypatch.setattr(tiling.tiler.commit, "commit_part", real_commit)
    assert 1 in cut and [s.id for s in open_store(str(out)).summary.sources] == [0, 1]
    results = run_ranks(cfg, 2)
    later = [i for i, owner in enumerate(owners) if owner == 1 and i > 1]
    assert owners[1] == 1 and later and results[1].parts_cut == len(later)  # none fit
    assert snapshot(str(out), {}) == snapshot(str(one_process), {})
