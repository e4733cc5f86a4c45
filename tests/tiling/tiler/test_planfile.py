"""The plan file (tiling.tiler.planfile): rank 0 plans a distributed tile run once and publishes the
plan beside the store; the other ranks load it under a key of their own inputs and options,
and plan themselves when none (or a foreign one) is there. At state counts (thousands of
footprints, no pixels) the published plan is the plan, and the planning paths it carries
(label matches, split blocks) agree with brute force on a sample."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from rasterio.crs import CRS

import tiling.tiler.plan
import tiling.tiler.stager
from tests.support.chipstores import config, snapshot
from tests.support.labels import pairwise_matches
from tests.tiling.rasters import Scenes
from tiling.chipstore.split import block_edge_m, block_hash, chip_blocks, choose_split
from tiling.sources.grid import chip_grid
from tiling.sources.labels import LabelIndex, footprint_in
from tiling.sources.rasters import RasterInfo
from tiling.tiler.config import TileConfig
from tiling.tiler.plan import (
    PlacedImage,
    TilePlan,
    assemble_plan,
    class_map_of,
    plan_tiling,
)
from tiling.tiler.planfile import (
    plan_for_rank,
    plan_from_json,
    plan_key,
    plan_to_json,
    publish_plan,
)
from tiling.tiler.staging import PartStaging
from tiling.tiler.tile import TileResult, tile

UTM18, ALBERS = CRS.from_epsg(26918), CRS.from_epsg(5070)


def same_plan(a: TilePlan, b: TilePlan) -> bool:
    """Equal plans, the per-chip arrays (left out of dataclass equality) included."""
    return a == b and all(
        np.array_equal(x.blocks, y.blocks) and np.array_equal(x.splits, y.splits)
        for x, y in zip(a.sources, b.sources, strict=True)
    )


@pytest.fixture()
def four(scenes: Scenes, tmp_path: Path) -> TileConfig:
    """Four labelled sources (copies of the two scenes), so two ranks own two each."""
    images = [
        shutil.copy(src, tmp_path / f"{name}.tif")
        for name, src in zip("abcd", [*scenes.images, *scenes.images], strict=True)
    ]
    return config(
        [Path(p) for p in images], tmp_path / "chips.zarr", labels=(str(scenes.nlcd),),
        class_map="nlcd", val_fraction=0.2, shard_size=3, min_valid=0.3, workers=1,
    )  # fmt: skip


def spy_planning(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the thread of every whole-run planning the plan file's users do."""
    calls: list[str] = []
    real = tiling.tiler.plan.plan_tiling

    def plan(cfg: TileConfig) -> TilePlan:
        calls.append(threading.current_thread().name)
        return real(cfg)

    monkeypatch.setattr("tiling.tiler.planfile.plan_tiling", plan)
    return calls


def test_ranks_plan_once_and_write_the_bytes_of_one_process(
    four: TileConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = replace(four, out=str(tmp_path / "one.zarr"))
    tile(one)
    calls = spy_planning(monkeypatch)
    results: dict[int, TileResult] = {}

    def rank_main(rank: int) -> None:
        results[rank] = tile(four, rank=rank, world_size=2)

    threads = [
        threading.Thread(target=rank_main, args=(r,), name=f"rank-{r}") for r in range(2)
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(results) == [0, 1]
    assert calls == ["rank-0"]  # rank 1 loaded rank 0's plan
    assert snapshot(four.out, {}) == snapshot(one.out, {})
    assert not Path(f"{four.out}.parts").exists()  # the plan went with the staging folder


def test_a_published_plan_loads_as_the_plan_and_a_rank_plans_itself_without_one(
    four: TileConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiling.tiler.stager, "COUNT_WAIT_S", 0.05)  # no rank 0 here
    fresh = plan_tiling(four)
    staging = PartStaging(four.out)
    calls = spy_planning(monkeypatch)
    assert same_plan(plan_for_rank(four, rank=1, world_size=2), fresh)
    assert len(calls) == 1  # nothing published: it planned the run itself
    key = publish_plan(fresh, staging)
    loaded = plan_for_rank(four, rank=1, world_size=2)
    assert same_plan(loaded, fresh) and len(calls) == 1  # loaded, not planned
    assert [s.image.crs.to_wkt() for s in loaded.sources] == [
        s.image.crs.to_wkt() for s in fresh.sources
    ]
    plan_file = Path(staging.url) / staging.plan_name(key)
    for body in (b"{not json", plan_file.read_bytes().replace(b'"threshold":', b'"threshold":1')):
        plan_file.write_bytes(body)  # damaged, or not the plan its key names: never used
        assert same_plan(plan_for_rank(four, rank=1, world_size=2), fresh)
    assert len(calls) == 3


def shifted(body: bytes, *, rehash: bool) -> bytes:
    """A plan file's bytes with every image moved 10 m east, as an edited copy would be;
    `rehash`: with the digest made again over the edit (an editor who knows the format)."""
    obj = json.loads(body)
    for source in obj["sources"]:
        source["image"]["transform"][2] += 10.0
    if rehash:
        content = {k: v for k, v in obj.items() if k != "sha256"}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"))
        obj["sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(obj, separators=(",", ":")).encode()


@pytest.mark.parametrize("rehash", [False, True], ids=["digest-stale", "digest-remade"])
def test_an_edited_plan_under_the_runs_key_is_not_used(
    four: TileConfig, monkeypatch: pytest.MonkeyPatch, rehash: bool
) -> None:
    """A copy of the plan edited to shift the images parses and has the run's key: a rank
    refuses it by its digest, or by the headers of the files it cuts, and plans itself."""
    monkeypatch.setattr(tiling.tiler.stager, "COUNT_WAIT_S", 0.05)
    fresh = plan_tiling(four)
    staging = PartStaging(four.out)
    key = publish_plan(fresh, staging)
    plan_file = Path(staging.url) / staging.plan_name(key)
    plan_file.write_bytes(shifted(plan_file.read_bytes(), rehash=rehash))
    calls = spy_planning(monkeypatch)
    for rank in (1, 2):  # each cuts sources of its own
        assert same_plan(plan_for_rank(four, rank=rank, world_size=3), fresh)
    assert len(calls) == 2  # neither rank used the edited plan


def test_the_key_covers_every_option_and_input_that_changes_the_plan(
    four: TileConfig, tmp_path: Path
) -> None:
    images, labels = four.images, four.labels
    stamps = [(1, "a")] * (len(images) + len(labels))
    key = plan_key(four, images, labels, stamps)
    same = [
        replace(four, out=str(tmp_path / "elsewhere.zarr")),
        replace(four, workers=7, overwrite=True, storage_options={"anon": True}),
        replace(four, stride=four.chip_size),  # the default stride, said explicitly
    ]
    assert {plan_key(c, images, labels, stamps) for c in same} == {key}
    other = [
        plan_key(replace(four, chip_size=32), images, labels, stamps),
        plan_key(replace(four, val_fraction=0.3), images, labels, stamps),
        plan_key(replace(four, zero_is_nodata=False), images, labels, stamps),
        plan_key(replace(four, class_map="chesapeake7"), images, labels, stamps),
        plan_key(four, images[::-1], labels, stamps),  # input order: source ids
        plan_key(four, images[1:], labels, stamps[1:]),
        plan_key(four, images, labels, [(1, "b"), *stamps[1:]]),  # a file changed
    ]
    assert len({key, *other}) == len(other) + 1
    # the stamp is the file's own: touching an input gives the plan another name
    staging = PartStaging(four.out)
    plan = plan_tiling(four)
    before = publish_plan(plan, staging)
    os.utime(images[0], ns=(1, 1))
    assert publish_plan(plan, staging) != before


def state_plan(
    n: int, *, chip: int = 64, size: int = 256
) -> tuple[TileConfig, TilePlan, list[RasterInfo]]:
    """A plan of `n` footprint-only images in UTM 18N (a row-by-row mosaic with overlaps)
    over 2 km label tiles in CONUS Albers, made as `plan_tiling` makes one, without files;
    and the label tiles."""

    def info(path: str, crs: CRS, x: float, y: float, px: int, count: int) -> RasterInfo:
        return RasterInfo(
            path=path, crs=crs, transform=Affine(1, 0, x, 0, -1, y), width=px, height=px,
            count=count, dtype="uint8", nodata=None, block_shape=(px, px), mask_kind="zero",
        )  # fmt: skip

    side = int(np.ceil(np.sqrt(n)))
    step = size - 8
    images = [
        info(f"i{k}.tif", UTM18, 300_000 + (k % side) * step, 4_400_000 - (k // side) * step,
             size, 4)
        for k in range(n)
    ]  # fmt: skip
    extent = info("all", UTM18, 300_000, 4_400_000, side * step + size, 4)
    left, bottom, right, top = footprint_in(extent, ALBERS)
    labels = [
        info(f"l{j}-{i}.tif", ALBERS, left + i * 2048, top - j * 2048, 2048, 1)
        for j in range(int((top - bottom) // 2048) + 1)
        for i in range(int((right - left) // 2048) + 1)
    ]
    cfg = TileConfig(images=("i*.tif",), labels=("l*.tif",), out="s.zarr", chip_size=chip,
                     class_map="nlcd", val_fraction=0.2)  # fmt: skip
    index = LabelIndex(labels)
    edge_m = block_edge_m(chip, cfg.split_block_chips, [1.0])
    placed = []
    for image in images:
        grid = chip_grid(size, size, chip, chip, where=image.path)
        placed.append(
            PlacedImage(image, grid, index.match(image), chip_blocks(image, grid, edge_m))
        )
    rule = choose_split(
        np.concatenate([p.blocks.reshape(-1, 2) for p in placed]), val_fraction=0.2, edge_m=edge_m
    )
    plan = assemble_plan(
        cfg, class_map=class_map_of(cfg), images=tuple(i.path for i in images),
        labels=tuple(lab.path for lab in labels), placed=placed, split=rule, skipped=(),
    )  # fmt: skip
    return cfg, plan, labels


def test_thousands_of_sources_round_trip_and_agree_with_brute_force_on_a_sample() -> None:
    cfg, plan, all_labels = state_plan(2000)
    key = "k" * 24
    body = plan_to_json(plan, key)
    loaded = plan_from_json(cfg, body, key=key, images=plan.params.images,
                            labels=plan.params.labels)  # fmt: skip
    assert same_plan(loaded, plan)
    with pytest.raises(ValueError, match="key"):
        plan_from_json(cfg, body, key="other", images=plan.params.images, labels=())
    # brute force on a sample: every label tile pairwise, every ground block of the run
    rng = np.random.default_rng(0)
    for k in rng.choice(len(plan.sources), 20, replace=False):
        source = loaded.sources[int(k)]
        assert source.labels == pairwise_matches(source.image, all_labels)
    distinct = sorted({tuple(b) for s in plan.sources for b in s.blocks.reshape(-1, 2).tolist()})
    hashes = sorted(block_hash(np.array(distinct, dtype=np.int64)).tolist())
    assert plan.split.threshold == hashes[round(0.2 * len(distinct))]
    for k in rng.choice(len(plan.sources), 20, replace=False):
        source = loaded.sources[int(k)]
        for (i, j), split in np.ndenumerate(source.splits):
            bx, by = source.blocks[i, j]
            expected = block_hash(np.array([bx, by], dtype=np.int64)) < plan.split.threshold
            assert split == int(bool(expected))
