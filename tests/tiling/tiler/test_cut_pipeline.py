"""The cut role's pipeline (`tiling.tiler.cut.Cutter`): windows are read and prepared on reader
threads while cutting threads compress earlier ones, in input order, and closing the
windows early leaves nothing running."""

from __future__ import annotations

import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import tiling.tiler.cut
from tests.support.chipstores import config, snapshot
from tests.tiling.rasters import Scenes
from tiling.chipstore.shards import ChunkEncoder
from tiling.sources.reader import RasterReader
from tiling.tiler.tile import plan_tiling, tile


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
