"""The cut role's pipeline (`tiling.tiler.cut.Cutter`): windows are read and prepared on reader
threads while cutting threads compress earlier ones, in input order, and closing the
windows early leaves nothing running."""

from __future__ import annotations

import threading
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rasterio._env import get_gdal_config

import tiling.tiler.cut
from tests.support.chipstores import config, snapshot
from tests.tiling.rasters import Scenes
from tiling.chipstore.shards import ChunkEncoder
from tiling.sources.reader import RasterReader
from tiling.tiler.tile import TilePlan, plan_tiling, tile


def thread_names_of(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> set[str]:
    """Names of the threads that call `owner.name` from now on."""
    names: set[str] = set()
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        names.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return names


@pytest.mark.parametrize("workers", [1, 2])
def test_reading_and_compressing_run_on_their_own_threads_and_the_store_is_the_same(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    serial = tmp_path / "serial.zarr"
    # the reference: every window read, prepared and compressed in the calling thread
    cfg = config(scenes.images, serial, workers=1, labels=tuple(map(str, scenes.chesapeake)))
    plan = plan_tiling(cfg)
    reader = RasterReader()
    try:
        windows = [
            tiling.tiler.cut._cut_window(reader, plan, source, window)
            for source in plan.sources
            for window in source.windows
        ]
    finally:
        reader.close()
    readers = thread_names_of(monkeypatch, RasterReader, "read_image")
    compressors = thread_names_of(monkeypatch, ChunkEncoder, "encode")
    out = tmp_path / f"{workers}.zarr"
    with closing(tiling.tiler.cut.Cutter(plan, None, workers)) as cutter:
        piped = list(cutter.windows(plan.sources))
    assert readers and all(n.startswith("tile-read") for n in readers)
    assert compressors and not any(n.startswith("tile-read") for n in compressors)
    assert [w.images for w in piped] == [w.images for w in windows]
    assert [w.labels for w in piped] == [w.labels for w in windows]
    assert [w.index.tolist() for w in piped] == [w.index.tolist() for w in windows]
    tile(config(scenes.images, out, workers=workers, labels=cfg.labels))
    tile(config(scenes.images, tmp_path / "again.zarr", workers=3, labels=cfg.labels))
    assert snapshot(str(out), {}) == snapshot(str(tmp_path / "again.zarr"), {})


def test_closing_the_windows_early_stops_reading_ahead(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_tiling(config(scenes.images, tmp_path / "s.zarr", workers=1))
    sources = list(plan.sources) * 3  # each source three times: windows read in turn
    total = sum(len(s.windows) for s in sources)
    prepared: list[int] = []
    real = tiling.tiler.cut._prepare_window

    def prepare(reader: Any, plan: Any, source: Any, window: Any) -> Any:
        prepared.append(source.id)
        return real(reader, plan, source, window)

    monkeypatch.setattr(tiling.tiler.cut, "_prepare_window", prepare)
    with closing(tiling.tiler.cut.Cutter(plan, None, 1)) as cutter:
        windows = cutter.windows(sources)
        next(windows)
        windows.close()
    # the first window, and at most the look-ahead (2 windows per worker) after it
    assert total > 4 and 1 <= len(prepared) <= 3


def test_a_source_given_twice_is_cut_twice_alike(scenes: Scenes, tmp_path: Path) -> None:
    plan = plan_tiling(config(scenes.images, tmp_path / "s.zarr", workers=2))
    with closing(tiling.tiler.cut.Cutter(plan, None, 2)) as cutter:
        windows = list(cutter.windows([plan.sources[0], plan.sources[0]]))
    half = len(windows) // 2
    assert half and [w.images for w in windows[:half]] == [w.images for w in windows[half:]]


def test_cutting_holds_gdals_block_cache_to_a_few_windows_per_reader(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GDAL's default cache (5 % of RAM) kept blocks of every source for the whole run."""
    plan = plan_tiling(config(scenes.images, tmp_path / "s.zarr", workers=2))
    before = get_gdal_config("GDAL_CACHEMAX")
    seen: list[Any] = []
    real = RasterReader.read_image

    def read_image(self: RasterReader, *args: Any) -> Any:
        seen.append(get_gdal_config("GDAL_CACHEMAX"))  # in a reader thread
        return real(self, *args)

    monkeypatch.setattr(RasterReader, "read_image", read_image)
    with closing(tiling.tiler.cut.Cutter(plan, None, 2)) as cutter:
        assert list(cutter.windows(plan.sources))
    assert seen and set(seen) == {tiling.tiler.cut.block_cache_bytes(plan, 2)}
    assert get_gdal_config("GDAL_CACHEMAX") == before  # restored on close


@pytest.mark.parametrize("workers", [1, 4, 16])
def test_the_block_cache_grows_with_the_windows_and_the_reader_threads(workers: int) -> None:
    image = SimpleNamespace(count=4, dtype="uint16")
    window = SimpleNamespace(height=512, width=6000)
    plan = cast(TilePlan, SimpleNamespace(sources=[SimpleNamespace(image=image, windows=[window])]))
    per_window = 512 * 6000 * (4 * 2 + 1)  # every band at 2 bytes, and a label band
    expected = max(
        tiling.tiler.cut.MIN_BLOCK_CACHE_BYTES,
        tiling.tiler.cut.WINDOWS_CACHED_PER_READER * workers * per_window,
    )
    assert tiling.tiler.cut.block_cache_bytes(plan, workers) == expected


class _Unread:
    """A source's windows that must not be read."""

    def __iter__(self) -> Any:
        raise AssertionError("read another source's windows")


def test_a_unit_of_one_source_sizes_the_cache_from_that_source_alone(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task engine runs `stage_source` once per source: sizing each unit's cache from every
    source of the plan would make thousands of sources cost thousands times each."""
    image = SimpleNamespace(count=4, dtype="uint8")
    one = SimpleNamespace(image=image, windows=[SimpleNamespace(height=256, width=256)])
    others = [SimpleNamespace(image=image, windows=_Unread()) for _ in range(5_000)]
    plan = cast(TilePlan, SimpleNamespace(sources=[*others, one]))
    assert tiling.tiler.cut.block_cache_bytes(plan, 1, cast(Any, [one])) == (
        tiling.tiler.cut.MIN_BLOCK_CACHE_BYTES
    )
    tile_config = config(scenes.images, tmp_path / "s.zarr", workers=1)
    real_plan = plan_tiling(tile_config)
    sized: list[Any] = []
    real = tiling.tiler.cut.block_cache_bytes

    def spy(plan: TilePlan, workers: int, sources: Any = None) -> int:
        sized.append(sources)
        return real(plan, workers, sources)

    monkeypatch.setattr(tiling.tiler.cut, "block_cache_bytes", spy)
    assert tiling.tiler.cut.stage_source(tile_config, real_plan, 1) > 0
    assert sized == [[real_plan.sources[1]]]
