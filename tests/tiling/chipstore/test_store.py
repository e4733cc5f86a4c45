"""The chip-store contract, run against a local path, memory:// and Azurite az:// stores.

`ChipStoreContract` is the one suite every storage backend must pass (like zarr's
StoreTests); the subclasses only say where stores live.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.azurite import Azurite
from tests.multiprocess import free_port
from tests.support.chipstores import chips, record, small_params, snapshot, write_source
from tests.tiling.rasters import Scenes
from tiling.chipstore.resume import open_writer
from tiling.chipstore.store import (
    ATTRS_KEY,
    FORMAT_VERSION,
    BandStats,
    ChipStore,
    assign_chips_to_ranks,
    load_shard_into_memory,
    open_store,
    shard_bytes,
)
from tiling.chipstore.store_format import done_chips
from tiling.chipstore.writer import ChipStoreWriter
from tiling.errors import StorageAccessError, StoreCorruptError, StoreError, StoreExistsError
from tiling.runtime.urls import filesystem
from tiling.tiler.tile import TileConfig, tile


def tile_config(scenes: Scenes, out: str, options: Mapping[str, Any], **kw: Any) -> TileConfig:
    base: dict[str, Any] = {
        "images": (str(scenes.root / "naip" / "*.tif"),),
        "labels": (str(scenes.root / "labels"),),
        "out": out,
        "chip_size": 64,
        "shard_size": 5,
        "min_valid": 0.5,
        "val_fraction": 0.25,
        "split_block_chips": 2,
        "workers": 2,
        "storage_options": dict(options),
    }
    base.update(kw)
    return TileConfig(**base)


@pytest.fixture(scope="module")
def reference(scenes: Scenes, tmp_path_factory: pytest.TempPathFactory) -> ChipStore:
    """The store every backend must reproduce, written once to a local path."""
    out = str(tmp_path_factory.mktemp("reference") / "ref.zarr")
    tile(tile_config(scenes, out, {}))
    return open_store(out)


class ChipStoreContract:
    """What every storage backend must do. Subclasses provide `url` and `options`."""

    options: Mapping[str, Any] = {}

    @pytest.fixture()
    def url(self) -> Callable[[str], str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_tile_then_read_back_matches_the_reference(
        self, url: Callable[[str], str], scenes: Scenes, reference: ChipStore
    ) -> None:
        out = url("chips.zarr")
        result = tile(tile_config(scenes, out, self.options))
        store = open_store(out, storage_options=self.options)
        assert result.summary == store.summary
        assert store.summary == reference.summary
        assert np.array_equal(store.index(), reference.index())
        images, labels = store.read_chips(store.chip_ids("all"))
        ref_images, ref_labels = reference.read_chips(reference.chip_ids("all"))
        assert np.array_equal(images, ref_images)
        assert labels is not None and ref_labels is not None
        assert np.array_equal(labels, ref_labels)
        assert store.stored_bytes() == reference.stored_bytes()
        assert snapshot(out, self.options) == snapshot(reference.url, {})

    def test_read_chips_returns_chips_in_the_order_asked(
        self, url: Callable[[str], str], scenes: Scenes, reference: ChipStore
    ) -> None:
        out = url("order.zarr")
        tile(tile_config(scenes, out, self.options))
        store = open_store(out, storage_options=self.options)
        n = store.summary.num_chips
        ids = np.array([n - 1, 0, 7, 7, n // 2, 3])
        images, labels = store.read_chips(ids)
        ref_images, ref_labels = reference.read_chips(np.arange(n))
        assert np.array_equal(images, ref_images[ids])
        assert labels is not None and ref_labels is not None
        assert np.array_equal(labels, ref_labels[ids])
        with pytest.raises(StoreError, match=rf"chip ids must be in 0..{n - 1}, got 0..{n}"):
            store.read_chips(np.array([0, n]))

    def test_ranks_partition_the_split_and_load_exactly_their_chips(
        self, url: Callable[[str], str], scenes: Scenes, reference: ChipStore
    ) -> None:
        out = url("ranks.zarr")
        tile(tile_config(scenes, out, self.options))
        summary = open_store(out, storage_options=self.options).summary
        train = reference.chip_ids("train")
        assert summary.num_train == train.size and summary.num_val > 0
        ref_images, ref_labels = reference.read_chips(np.arange(summary.num_chips))
        shards = [
            load_shard_into_memory(
                out, rank=r, world_size=3, split="train", storage_options=self.options
            )
            for r in range(3)
        ]
        assert np.array_equal(np.sort(np.concatenate([s.chip_ids for s in shards])), train)
        sources = reference.index()[:, 0]
        for s in shards:
            # interleaved shard objects: every rank sees both images, not one region each
            assert set(sources[s.chip_ids].tolist()) == {0, 1}
            assert np.array_equal(s.chip_ids, np.sort(s.chip_ids))
            assert np.array_equal(s.images, ref_images[s.chip_ids])
            assert s.labels is not None and np.array_equal(s.labels, ref_labels[s.chip_ids])
            assert 0 < s.bytes_read <= reference.stored_bytes()
            assert s.load_time_s > 0
        assert shard_bytes(summary, world_size=3, split="train") == max(s.nbytes for s in shards)

    def test_readers_see_only_chips_of_done_sources(self, url: Callable[[str], str]) -> None:
        out = url("atomic.zarr")
        writer = open_writer(out, small_params(("s0", "s1")), storage_options=self.options)
        first = chips(7, seed=0)
        write_source(writer, 0, first)
        writer.begin_source(record(1))
        second = chips(9, seed=1)
        writer.append(*second)  # 16 rows: 3 shards of 5 written, the source not committed
        store = open_store(out, storage_options=self.options)
        assert store.summary.num_chips == 7
        assert [s.id for s in store.summary.sources] == [0]
        assert store.index().shape == (7, 4)
        images, labels = store.read_chips(np.arange(7))
        assert np.array_equal(images, first[0])
        assert labels is not None and np.array_equal(labels, first[1])
        written = snapshot(out, self.options)
        assert {"images/c/1/0/0/0", "images/c/2/0/0/0", "labels/c/2/0/0"} <= set(written)

    def test_resume_after_an_interruption_writes_the_same_bytes(
        self,
        url: Callable[[str], str],
        scenes: Scenes,
        reference: ChipStore,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        out = url("resumed.zarr")
        interrupt_after_appends(monkeypatch, 3)  # inside source 2: a half-written tail
        with pytest.raises(KeyboardInterrupt):
            tile(tile_config(scenes, out, self.options))
        monkeypatch.undo()
        partial = open_store(out, storage_options=self.options).summary
        assert not partial.complete and partial.num_chips < reference.summary.num_chips
        result = tile(tile_config(scenes, out, self.options))
        assert result.sources_resumed == len(partial.sources)
        assert snapshot(out, self.options) == snapshot(reference.url, {})

    def test_a_complete_store_is_refused_and_overwrite_rebuilds_it(
        self, url: Callable[[str], str], scenes: Scenes
    ) -> None:
        out = url("complete.zarr")
        tile(tile_config(scenes, out, self.options))
        with pytest.raises(
            StoreExistsError,
            match=r"exists and is complete \(\d+ chips from 2 "
            r"sources\); pass --overwrite to rebuild it or choose another --out",
        ):
            tile(tile_config(scenes, out, self.options))
        with pytest.raises(
            StoreExistsError,
            match=r"exists and was written with other options "
            r"\(chip_size 64 \(now 80\).*\); rerun the original command to "
            "resume it, or pass --overwrite to replace it",
        ):
            tile(tile_config(scenes, out, self.options, chip_size=80))
        result = tile(tile_config(scenes, out, self.options, chip_size=80, overwrite=True))
        assert open_store(out, storage_options=self.options).summary.chip_size == 80
        assert result.summary.complete

    def test_a_store_of_a_newer_format_is_refused(
        self, url: Callable[[str], str], scenes: Scenes
    ) -> None:
        out = url("newer.zarr")
        tile(tile_config(scenes, out, self.options))
        group = zarr.open_group(store=_zarr_store(out, self.options), mode="r+")
        meta = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
        group.update_attributes({ATTRS_KEY: {**meta, "version": 99}})
        message = (
            rf"chip store format version 99 is newer than this landcover reads \(version "
            rf"{FORMAT_VERSION}\)"
        )
        with pytest.raises(StoreError, match=message):
            open_store(out, storage_options=self.options)
        with pytest.raises(StoreError, match=message):
            tile(tile_config(scenes, out, self.options))

    def test_a_missing_shard_object_fails_the_read_naming_the_chips_and_the_fix(
        self, url: Callable[[str], str], scenes: Scenes
    ) -> None:
        out = url("lost.zarr")
        tile(tile_config(scenes, out, self.options))
        store = open_store(out, storage_options=self.options)
        assert store.missing_objects() == []
        fs, root = filesystem(out, self.options)
        fs.rm(f"{root.rstrip('/')}/images/c/2/0/0/0")
        message = (
            r"lost.zarr: chips 10..14 \(images shard 2\) missing: shard object not found; the "
            r"store is damaged, re-tile with: landcover tile .* --overwrite"
        )
        with pytest.raises(StoreCorruptError, match=message):
            store.read_chips(np.arange(store.summary.num_chips))
        with pytest.raises(StoreCorruptError, match=message):
            load_shard_into_memory(
                out, rank=0, world_size=1, split="all", storage_options=self.options
            )
        assert store.missing_objects() == ["images shard 2 (chips 10..14)"]
        # chips of the other shard objects still read
        images, _ = store.read_chips(np.arange(10))
        ref_images, _ = open_store(out, storage_options=self.options).read_chips(np.arange(10))
        assert np.array_equal(images, ref_images)

    @pytest.mark.parametrize("where", ["chunk", "shard index", "index array"])
    def test_flipped_bytes_fail_the_read(
        self, url: Callable[[str], str], scenes: Scenes, where: str
    ) -> None:
        out = url(f"flipped-{where.replace(' ', '-')}.zarr")
        tile(tile_config(scenes, out, self.options))
        fs, root = filesystem(out, self.options)
        key = "index/c/1/0" if where == "index array" else "labels/c/1/0/0"
        path = f"{root.rstrip('/')}/{key}"
        data = bytearray(fs.cat_file(path))
        data[{"chunk": 40, "shard index": -30, "index array": 20}[where]] ^= 0x5A
        fs.pipe_file(path, bytes(data))
        store = open_store(out, storage_options=self.options)
        name = "index" if where == "index array" else "labels"
        with pytest.raises(StoreCorruptError, match=rf"chips 5..9 \({name} shard 1\) corrupt: "):
            store.index()
            store.read_chips(np.arange(5, 10))
        with pytest.raises(StoreCorruptError, match=r"chips 5..9"):
            store.verify()

    def test_opening_a_missing_store_names_the_fix(self, url: Callable[[str], str]) -> None:
        out = url("missing.zarr")
        with pytest.raises(
            StoreError,
            match=r"missing.zarr: no chip store there; create one "
            "with `landcover tile",
        ):
            open_store(out, storage_options=self.options)


class TestLocalStore(ChipStoreContract):
    @pytest.fixture()
    def url(self, tmp_path: Path) -> Callable[[str], str]:
        return lambda name: str(tmp_path / name)


class TestMemoryStore(ChipStoreContract):
    @pytest.fixture()
    def url(self) -> Callable[[str], str]:
        prefix = uuid.uuid4().hex[:10]
        return lambda name: f"memory://{prefix}/{name}"


@pytest.mark.azurite
class TestAzuriteStore(ChipStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, azurite: Azurite) -> None:
        self.options = azurite.storage_options

    @pytest.fixture()
    def url(self, azurite: Azurite) -> Callable[[str], str]:
        prefix = uuid.uuid4().hex[:10]
        return lambda name: azurite.url(f"{prefix}/{name}")


# --- helpers for writer-level tests -----------------------------------------------------


def _zarr_store(url: str, options: Mapping[str, Any]) -> Any:
    from tiling.chipstore.zarrstore import zarr_store

    return zarr_store(url, storage_options=options)


def interrupt_after_appends(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the n-th ChipStoreWriter.append_encoded raise, as a Ctrl-C or a killed job would."""
    calls = {"n": 0}
    real_append = ChipStoreWriter.append_encoded

    def append(self: ChipStoreWriter, *args: Any) -> None:
        real_append(self, *args)
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(ChipStoreWriter, "append_encoded", append)


# --- pure parts of the API --------------------------------------------------------------


@settings(deadline=None)  # no timed asserts
@given(
    st.lists(st.integers(0, 2000), max_size=1500),
    st.integers(1, 40),
    st.integers(1, 70),
)
def test_ranks_get_balanced_interleaved_shards(raw: list[int], world: int, shard: int) -> None:
    ids = np.array(sorted(set(raw)), dtype=np.int64)[::-1]
    parts = assign_chips_to_ranks(ids, world, shard_size=shard)
    assert len(parts) == world
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(ids))
    assert all(np.array_equal(p, np.sort(p)) for p in parts)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(parts, assign_chips_to_ranks(ids, world, shard_size=shard), strict=True)
    )
    # few reads: about 1/world of the shard objects each, plus those the rebalancing adds
    groups = np.unique(ids // shard).size
    for p in parts:
        assert np.unique(p // shard).size <= -(-groups // world) + shard


def test_ranks_sample_the_whole_store_not_one_run_each() -> None:
    ids = np.arange(1000)
    parts = assign_chips_to_ranks(ids, 4, shard_size=50)  # 20 shard objects
    for r, p in enumerate(parts):
        assert p.size == 250
        assert np.unique(p // 50).tolist() == list(range(r, 20, 4))  # round-robin objects
        assert p.min() < 250 and p.max() >= 750


def test_world_size_must_be_positive() -> None:
    with pytest.raises(StoreError, match="world_size must be at least 1, got 0"):
        assign_chips_to_ranks(np.arange(3), 0)


@settings(deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=400), st.integers(0, 5))
def test_band_stats_are_exact_and_combine_like_one_pass(values: list[int], cut: int) -> None:
    data = np.array(values, dtype=np.int64)
    cut = min(cut, data.size)

    def stats(x: np.ndarray) -> BandStats:
        s, sq = int(x.sum()), int((x * x).sum())
        return BandStats(sums=(s,) * 4, sums_sq=(sq,) * 4, count=int(x.size))

    combined = stats(data[:cut]) + stats(data[cut:])
    assert combined == stats(data)
    assert combined.mean[0] == pytest.approx(float(data.mean()), rel=1e-12)
    assert combined.std[0] == pytest.approx(float(data.std()), rel=1e-9, abs=1e-9)
    assert BandStats.from_json(combined.to_json()) == combined


def test_unreachable_azure_account_fails_fast_with_one_line() -> None:
    closed = f"http://127.0.0.1:{_closed_port()}/devstoreaccount1"
    options = {
        "connection_string": f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey=a2V5;BlobEndpoint={closed};"
    }
    with pytest.raises(
        StorageAccessError,
        match=r"az://chips/x.zarr: cannot reach storage "
        r"account endpoint 127.0.0.1:\d+ \(Connection refused\); check "
        "account_name / connection_string in --storage-options",
    ):
        open_store("az://chips/x.zarr", storage_options=options)


def test_az_url_without_any_account_names_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        StorageAccessError,
        match=r"az://chips/x.zarr: no Azure account given; "
        "pass --storage-options",
    ):
        open_store("az://chips/x.zarr")


def test_memory_stores_at_different_urls_are_independent() -> None:
    a, b = f"memory://{uuid.uuid4().hex}/a.zarr", f"memory://{uuid.uuid4().hex}/b.zarr"
    writer = open_writer(a, small_params(("s0",)))
    write_source(writer, 0, chips(3, seed=0))
    writer.finish()
    assert open_store(a).summary.num_chips == 3
    with pytest.raises(StoreError, match="no chip store there"):
        open_store(b)
    fs = fsspec.filesystem("memory")
    assert fs.exists(a.removeprefix("memory:/"))


def _closed_port() -> int:
    return free_port()  # bound and released: nothing listens there


# --- integrity: what is not damage, and stores of format version 1 ----------------------


def test_a_shard_of_empty_chips_has_no_object_and_is_not_damage(tmp_path: Path) -> None:
    out = str(tmp_path / "empty.zarr")
    writer = open_writer(out, small_params(("s0",)))
    images, labels, index = chips(12, seed=0)
    images[5:10] = 0  # shard 1 (rows 5..9): every chip all fill, so zarr stores nothing
    labels[5:10] = 0
    write_source(writer, 0, (images, labels, index))
    writer.finish()
    assert "images/c/1/0/0/0" not in snapshot(out, {})
    store = open_store(out)
    assert store.missing_objects() == []
    read_images, read_labels = store.read_chips(np.arange(12))
    assert np.array_equal(read_images, images)
    assert read_labels is not None and np.array_equal(read_labels, labels)
    store.verify()


def as_version_2(url: str) -> None:
    """Rewrite a store as landcover's format version 2 wrote it: every source record, the
    parameters and the label fingerprints in the group attribute, no `sources` array."""
    import json
    import shutil

    root = Path(url)
    group = zarr.open_group(url, mode="r+")
    table = group["sources"]
    assert isinstance(table, zarr.Array)
    meta = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
    done = len(done_chips(meta))
    records = [json.loads(str(text)) for text in np.asarray(table[:done])]
    created = {key: table.attrs[key] for key in ("params", "label_fingerprints")}
    shutil.rmtree(root / "sources")
    meta.pop("source_chips")
    meta.pop("params_sha256")
    group.update_attributes({ATTRS_KEY: {**meta, **created, "version": 2, "sources": records}})


def as_version_1(url: str) -> None:
    """Rewrite a store as landcover's format version 1 wrote it: no chunk checksums, no
    stored-chunk counts, fingerprints, split or nodata rule in the attributes."""
    import json

    from tiling.chipstore.shards import decode_shard, encode_shard

    as_version_2(url)
    root = Path(url)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or "/c/" not in rel:
            continue
        data = path.read_bytes()
        if rel.startswith("index/"):
            path.write_bytes(data[:-4])
            continue
        shard = decode_shard(data, 5)
        rebuilt = encode_shard([c[:-4] if c else None for c in shard], 5)
        assert rebuilt is not None
        path.write_bytes(rebuilt)
    for meta_path in root.glob("*/zarr.json"):
        meta = json.loads(meta_path.read_text())
        codecs = meta["codecs"]
        inner = codecs[0]["configuration"]["codecs"] if "sharding" in codecs[0]["name"] else codecs
        inner[:] = [c for c in inner if c["name"] != "crc32c"]
        meta_path.write_text(json.dumps(meta))
    group = zarr.open_group(url, mode="r+")
    attrs = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
    for key in ("split", "zero_is_nodata", "label_fingerprints"):
        attrs.pop(key)
    attrs["sources"] = [
        {k: v for k, v in s.items() if k not in ("image_chunks", "label_chunks", "fingerprint")}
        for s in attrs["sources"]
    ]
    group.update_attributes({ATTRS_KEY: {**attrs, "version": 1}})


def assert_an_incomplete_one_is_not_resumed(cfg: TileConfig, *, version: int) -> None:
    """The store at `cfg.out`, of an older format `version`, made incomplete: `tile` refuses
    to resume it."""
    group = zarr.open_group(cfg.out, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])  # type: ignore[arg-type]
    group.update_attributes({ATTRS_KEY: {**meta, "complete": False}})
    with pytest.raises(
        StoreExistsError,
        match=rf"{re.escape(cfg.out)} exists and was written by an older landcover \(chip "
        rf"store format version {version}, now {FORMAT_VERSION}\); pass --overwrite to rebuild it",
    ):
        tile(cfg)


def test_a_version_2_store_reads_the_same_and_is_not_resumed(
    scenes: Scenes, tmp_path: Path, reference: ChipStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Version 2 kept the source records in the group attribute; they read as before."""
    out = str(tmp_path / "v2.zarr")
    cfg = tile_config(scenes, out, {})
    tile(cfg)
    as_version_2(out)
    with caplog.at_level("WARNING", logger="tiling"):
        store = open_store(out)
    assert caplog.messages == []
    assert store.summary.integrity_checked and store.summary.format_version == 2
    assert store.summary == replace(reference.summary, format_version=2)
    store.verify()
    assert_an_incomplete_one_is_not_resumed(cfg, version=2)


def test_a_version_1_store_reads_with_one_warning_and_is_not_resumed(
    scenes: Scenes, tmp_path: Path, reference: ChipStore, caplog: pytest.LogCaptureFixture
) -> None:
    out = str(tmp_path / "v1.zarr")
    cfg = tile_config(scenes, out, {})
    tile(cfg)
    as_version_1(out)
    with caplog.at_level("WARNING", logger="tiling"):
        store = open_store(out)
    assert caplog.messages == [
        f"{out}: chip store format version 1 has no checksums, so lost or damaged shard "
        "objects cannot be detected; re-tile it with --overwrite to upgrade"
    ]
    assert not store.summary.integrity_checked
    assert np.array_equal(store.index(), reference.index())
    images, labels = store.read_chips(store.chip_ids("all"))
    ref_images, ref_labels = reference.read_chips(reference.chip_ids("all"))
    assert np.array_equal(images, ref_images)
    assert labels is not None and ref_labels is not None and np.array_equal(labels, ref_labels)
    assert_an_incomplete_one_is_not_resumed(cfg, version=1)
    assert tile(tile_config(scenes, out, {}, overwrite=True)).summary.integrity_checked
