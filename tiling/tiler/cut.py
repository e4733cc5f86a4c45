"""Tile's cut role: read a source's windows and turn them into encoded chips with their
statistics, in input order, K windows at a time; and the units of work built on it.

K reader threads each read one window of an image (GDAL decodes with the GIL released),
align its labels, and pick its chips; K cutting threads copy each chip out, add up its
statistics and compress it (zstd releases the GIL too), so reading the next windows overlaps
compressing earlier ones.
The caller takes the windows strictly in input order (sources in the order given, windows
row-major), so what it appends or stages is the same for any K. Threads rather than
processes: nothing has to be pickled, and adlfs/zarr event loops do not survive a fork.

A `Cutter` holds the reader and the threads for one process. On top of it:
`stage_owned` is a rank's whole job in a distributed run but rank 0's (cut the sources it
owns and stage each as a part beside the store, `tiling.tiler.ranks`), and `stage_source` is the
unit of work a task scheduler runs (`tiling.tiler.units`): cut one source and stage its part.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.errors
import rasterio.windows

from tiling.chipstore.shards import ChunkEncoder, EncodedChunk
from tiling.chipstore.store import NUM_BANDS, SPLIT_TRAIN
from tiling.errors import SourceFormatError
from tiling.runtime.gdal import gdal_reason
from tiling.sources.grid import ReadWindow
from tiling.sources.reader import RasterReader
from tiling.tiler.chipstats import add_band_sums, count_classes
from tiling.tiler.commit import stored_done_chips
from tiling.tiler.config import TileConfig
from tiling.tiler.parts import build_part, part_key
from tiling.tiler.plan import SourcePlan, TilePlan
from tiling.tiler.rankplan import RankPlan, input_fingerprints
from tiling.tiler.ranks import stage_rank
from tiling.tiler.staging import PartStaging

__all__ = ["Cutter", "WindowChips", "block_cache_bytes", "stage_owned", "stage_source"]

# GDAL's block cache while cutting. A window's blocks are decoded once and copied out, and
# at most the next window of the same source shares a block row with it, so a few windows
# per reader thread are all a cache can serve. GDAL's default (5 % of RAM) instead keeps
# blocks of every source open for the whole run: hundreds of MB never read again, whose
# pages cost CPU to fault in and press on the page cache the store is written through.
MIN_BLOCK_CACHE_BYTES = 64 * 1024 * 1024
WINDOWS_CACHED_PER_READER = 4


def block_cache_bytes(
    plan: TilePlan, workers: int, sources: Sequence[SourcePlan] | None = None
) -> int:
    """GDAL's block cache for cutting `sources` of `plan` (None: all of them) with `workers`
    reader threads: room for `WINDOWS_CACHED_PER_READER` of their largest windows per thread
    (every band of the image at its data type, and a label band), and at least
    `MIN_BLOCK_CACHE_BYTES`. A unit that cuts one source reads that source's windows only, so
    thousands of units cost no more each than one."""
    largest = max(
        (
            w.height * w.width * (s.image.count * np.dtype(s.image.dtype).itemsize + 1)
            for s in (plan.sources if sources is None else sources)
            for w in s.windows
        ),
        default=0,
    )
    return max(MIN_BLOCK_CACHE_BYTES, WINDOWS_CACHED_PER_READER * workers * largest)


@dataclass(slots=True)
class WindowChips:
    """Chips cut from one read window, compressed, with their statistics."""

    images: list[EncodedChunk]
    labels: list[EncodedChunk]
    index: npt.NDArray[np.int32]
    sums: npt.NDArray[np.uint64]  # (4,) over valid pixels of kept chips
    sums_sq: npt.NDArray[np.uint64]
    valid_px: int
    class_counts: npt.NDArray[np.int64]
    train: int
    val: int
    candidates: int


class Cutter:
    """Cuts the sources of `plan` with `workers` threads, `2 * workers` windows in flight,
    until `close` (`with contextlib.closing(Cutter(...))`, in the thread that made it), with
    GDAL's block cache at `block_cache_bytes` meanwhile, sized for `sources` (None: all of the
    plan's; a unit that cuts one source gives it).

    Each window is read and prepared (pixels, masks, labels, the chips kept) on one of
    `workers` reader threads as soon as it is queued, and its chips are copied out, counted
    and compressed on one of `workers` cutting threads: GDAL decodes the next windows while
    zstd compresses earlier ones (both release the GIL), so the process does not wait on
    reads.
    """

    def __init__(
        self,
        plan: TilePlan,
        storage_options: Mapping[str, Any] | None,
        workers: int,
        *,
        sources: Sequence[SourcePlan] | None = None,
    ) -> None:
        self.plan, self.workers = plan, workers
        self._reader = RasterReader(storage_options=storage_options)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tile")
        self._read_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tile-read")
        # GDAL's cache size is one setting for the process; the Env restores it on close
        cache = block_cache_bytes(plan, workers, sources)
        self._gdal_env = rasterio.Env(GDAL_CACHEMAX=cache)
        self._gdal_env.__enter__()

    def close(self) -> None:
        """Wait for the windows under way, then close the reader."""
        try:
            self._pool.shutdown(wait=True)
            self._read_pool.shutdown(wait=True)
        finally:
            try:
                self._reader.close()
            finally:
                self._gdal_env.__exit__(None, None, None)

    def source(self, source: SourcePlan) -> Iterator[WindowChips]:
        """The cut windows of one source, in order (`tiling.tiler.parts.CutSource`)."""
        return self.windows([source])

    def windows(self, sources: Sequence[SourcePlan]) -> Generator[WindowChips, None, None]:
        """The cut windows of `sources`, in order; closing the generator cancels the windows
        not started yet."""
        tasks = [(source, window) for source in sources for window in source.windows]
        plan = self.plan
        ahead = _ReadAhead(self._reader, self._read_pool, plan)

        def submit(task: tuple[SourcePlan, ReadWindow]) -> Future[WindowChips]:
            source, window = task
            ahead.start(source, window)
            return self._pool.submit(_cut_window, ahead, plan, source, window)

        return _in_order(tasks, submit, lookahead=2 * self.workers, on_close=ahead.cancel)


@dataclass(slots=True)
class _PreparedWindow:
    """One read window and the chips of it that are kept, not yet copied out or compressed."""

    pixels: npt.NDArray[np.uint8]  # (bands, h, w) of the window, invalid pixels 0
    codes: npt.NDArray[np.uint8] | None  # (h, w) class codes, 0 where the image has no data
    offsets: list[tuple[int, int]]  # (row, column) in the window of each kept chip
    index: npt.NDArray[np.int32]
    valid_px: int
    train: int
    candidates: int


_WindowKey = tuple[int, int, int]  # source id, row, column of a read window


class _ReadAhead:
    """Windows prepared ahead on reader threads: `start` queues a window, `take` returns it
    prepared (or raises what preparing it raised)."""

    def __init__(self, reader: RasterReader, pool: ThreadPoolExecutor, plan: TilePlan) -> None:
        self._reader, self._pool, self._plan = reader, pool, plan
        # a deque per window: a source given twice is cut twice, in order
        self._started: defaultdict[_WindowKey, deque[Future[_PreparedWindow]]] = defaultdict(deque)
        self._lock = threading.Lock()

    def start(self, source: SourcePlan, window: ReadWindow) -> None:
        future = self._pool.submit(_prepare_window, self._reader, self._plan, source, window)
        with self._lock:
            self._started[(source.id, window.row_px, window.col_px)].append(future)

    def take(self, source: SourcePlan, window: ReadWindow) -> _PreparedWindow:
        key = (source.id, window.row_px, window.col_px)
        with self._lock:
            queued = self._started.get(key)
            future = queued.popleft() if queued else None
        if future is None:  # not started ahead: prepare it here
            return _prepare_window(self._reader, self._plan, source, window)
        return future.result()

    def cancel(self) -> None:
        """Cancel the windows not started yet (they will not be cut)."""
        with self._lock:
            started, self._started = self._started, defaultdict(deque)
        for queued in started.values():
            for future in queued:
                future.cancel()


def _in_order(
    tasks: Sequence[Any],
    submit: Callable[[Any], Future[WindowChips]],
    *,
    lookahead: int,
    on_close: Callable[[], None] = lambda: None,
) -> Generator[WindowChips, None, None]:
    """Results of the futures `submit(task)` in task order, with at most `lookahead` tasks
    in flight; on close, the futures not started are cancelled and `on_close` is called."""
    pending: deque[Future[WindowChips]] = deque()
    it = iter(tasks)
    try:
        for task in it:
            pending.append(submit(task))
            if len(pending) >= lookahead:
                break
        while pending:
            result = pending.popleft().result()
            for task in it:
                pending.append(submit(task))
                break
            yield result
    finally:
        for future in pending:
            future.cancel()
        on_close()


def _cut_window(
    reader: RasterReader | _ReadAhead, plan: TilePlan, source: SourcePlan, window: ReadWindow
) -> WindowChips:
    """The kept chips of one window, compressed, with their statistics; the window is
    prepared by `reader` (`_ReadAhead`: on a reader thread, started earlier) or here.

    Each chip is copied out, counted and compressed in turn here, while it is in cache; the
    reader threads, which also decode the next windows, only pick the chips.
    """
    if isinstance(reader, _ReadAhead):
        prepared = reader.take(source, window)
    else:
        prepared = _prepare_window(reader, plan, source, window)
    encode = ChunkEncoder(plan.params.compression_level).encode
    c = plan.params.chip_size
    num_classes = plan.class_map.num_classes if plan.class_map else 0
    sums = np.zeros(NUM_BANDS, dtype=np.uint64)
    sums_sq = np.zeros(NUM_BANDS, dtype=np.uint64)
    class_counts = np.zeros(num_classes, dtype=np.int64)
    images: list[EncodedChunk] = []
    labels: list[EncodedChunk] = []
    pixels, codes = prepared.pixels, prepared.codes
    for r, k in prepared.offsets:
        chip = np.ascontiguousarray(pixels[:, r : r + c, k : k + c])
        add_band_sums(chip, sums, sums_sq)
        images.append(encode(chip))
        if codes is not None:
            chip_codes = np.ascontiguousarray(codes[r : r + c, k : k + c])
            class_counts += count_classes(chip_codes, num_classes)
            labels.append(encode(chip_codes))
    return WindowChips(
        images=images,
        labels=labels,
        index=prepared.index,
        sums=sums,
        sums_sq=sums_sq,
        valid_px=prepared.valid_px,
        class_counts=class_counts,
        train=prepared.train,
        val=len(prepared.index) - prepared.train,
        candidates=prepared.candidates,
    )


def _prepare_window(
    reader: RasterReader, plan: TilePlan, source: SourcePlan, window: ReadWindow
) -> _PreparedWindow:
    """Read one window, align labels, and pick the chips with enough valid pixels."""
    image = source.image
    rio_window = rasterio.windows.Window(window.col_px, window.row_px, window.width, window.height)
    try:
        pixels, valid = reader.read_image(image, rio_window)
        codes = (
            reader.read_labels(image, rio_window, source.labels, plan.class_map)
            if plan.class_map is not None
            else None
        )
    except rasterio.errors.RasterioError as exc:
        raise SourceFormatError(
            f"{image.path}: cannot read pixels ({gdal_reason(exc)}); re-download it or leave it out"
        ) from None
    if codes is not None and not valid.all():
        np.multiply(codes, valid, out=codes)  # no label where the image has no data
    c = plan.params.chip_size
    min_valid_px = plan.params.min_valid * c * c
    valid_px = 0
    offsets: list[tuple[int, int]] = []
    rows: list[tuple[int, int, int, int]] = []
    train = 0
    for i, j in window.chips:
        row, col = source.grid.chip_origin(i, j)
        r, k = row - window.row_px, col - window.col_px
        n_valid = int(np.count_nonzero(valid[r : r + c, k : k + c]))
        if n_valid < min_valid_px:
            continue
        if (
            codes is not None
            and min_valid_px > 0
            and np.count_nonzero(codes[r : r + c, k : k + c]) < min_valid_px
        ):
            continue
        valid_px += n_valid
        offsets.append((r, k))
        split = source.split_of(i, j)
        train += split == SPLIT_TRAIN
        rows.append((source.id, row, col, split))
    return _PreparedWindow(
        pixels=pixels,
        codes=codes,
        offsets=offsets,
        index=np.array(rows, dtype=np.int32).reshape(-1, 4),
        valid_px=valid_px,
        train=train,
        candidates=len(window.chips),
    )


def stage_owned(
    work: RankPlan, cutter: Cutter, *, progress: Callable[[int], None] | None = None
) -> int:
    """A rank other than 0: cut the sources it owns and stage each as a part beside the
    store (`tiling.tiler.ranks.stage_rank`), skipping those the store holds already; parts cut."""
    config, plan = work.config, work.plan
    if config.overwrite:
        done: Callable[[], list[int]] = list  # the store is rebuilt: nothing in it counts
    else:
        digest = plan.params.digest()  # once: the store itself is asked afresh at each poll

        def done() -> list[int]:
            return stored_done_chips(config.out, digest, config.storage_options)

    return stage_rank(
        plan,
        work.mine,
        work.staging(),
        cutter.source,
        work.prints,
        done_chips=done,
        progress=progress,
    )


def stage_source(config: TileConfig, plan: TilePlan, source_id: int) -> int:
    """Cut source `source_id` of `plan` and stage its part (kept when already staged whole
    under the same key); the part's chips."""
    source = plan.sources[source_id]
    workers = config.effective_workers
    prints = input_fingerprints(config, [source], [lab.path for lab in source.labels], workers)
    key = part_key(plan.params, source, prints)
    staging = PartStaging(config.out, config.storage_options)
    staged = staging.get(source.id, key)
    if staged is not None and staged.interior is None:
        return staged.num_chips
    with closing(Cutter(plan, config.storage_options, workers, sources=[source])) as cutter:
        part = build_part(source.id, key, plan.num_classes, cutter.source(source))
    staging.put(part)
    return part.num_chips
