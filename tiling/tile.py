"""Orchestration: sources → chip grid → chip store, in parallel, resumable, deterministic.

`plan_tiling` checks every input once at the boundary (files, bands, dtype, CRS, label
footprints, chip size) without reading pixels; `tile` then writes the store.

Parallelism: K worker threads each read one window of an image (GDAL decodes with the GIL
released), align its labels, and cut, filter and count its chips; the calling thread is the
single writer and appends the windows' chips strictly in input order (sources in the order
given, windows row-major), while zarr compresses shards on its own thread pool. The store
is therefore byte-for-byte the same for any K. Threads rather than processes: nothing has
to be pickled, and adlfs/zarr event loops do not survive a fork.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.errors
import rasterio.windows

from tiling.classes import DEFAULT_CLASS_MAP, IDENTITY, ClassMap, get_class_map
from tiling.errors import SourceFormatError, TilingError
from tiling.grid import ChipGrid, ReadWindow, chip_grid, val_blocks
from tiling.shards import ChunkEncoder, EncodedChunk
from tiling.sources import (
    RasterInfo,
    RasterReader,
    expand_inputs,
    match_labels,
    open_image,
    open_label,
)
from tiling.store import (
    NUM_BANDS,
    SPLIT_TRAIN,
    SPLIT_VAL,
    BandStats,
    SourceRecord,
    StoreSummary,
)
from tiling.writer import ChipStoreWriter, StoreParams, open_writer

logger = logging.getLogger(__name__)

# Read windows at most this wide: bounds one worker's window to ~32 MB for 4-band uint8
# at the tallest usual window (1024 rows), however wide the mosaic.
MAX_WINDOW_WIDTH_PX = 8192
# Windows of labels and image are at least this tall (or one TIFF block, if taller), so
# a strip-organised file is read in a few large requests.
MIN_WINDOW_HEIGHT_PX = 256


def available_cores() -> int:
    """CPU cores this process may use (affinity and cgroup-restricted where visible)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class TileConfig:
    """Options of `landcover tile`."""

    images: tuple[str, ...]
    out: str
    labels: tuple[str, ...] = ()
    chip_size: int = 256
    stride: int | None = None  # None: chip_size (no overlap)
    shard_size: int = 64
    min_valid: float = 0.9
    class_map: str = DEFAULT_CLASS_MAP
    num_classes: int | None = None  # only for class_map="identity"
    val_fraction: float = 0.1
    split_block_chips: int = 4
    workers: int | None = None  # None: every available core
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    compression_level: int = 3

    @property
    def effective_stride(self) -> int:
        return self.chip_size if self.stride is None else self.stride

    @property
    def effective_workers(self) -> int:
        return available_cores() if self.workers is None else self.workers


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """One image to tile: its grid, labels, read windows and validation blocks."""

    id: int
    image: RasterInfo
    labels: tuple[RasterInfo, ...]
    grid: ChipGrid
    windows: tuple[ReadWindow, ...]
    val_mask: npt.NDArray[np.bool_] = field(compare=False)  # per split block

    def split_of(self, i: int, j: int, block_chips: int) -> int:
        return SPLIT_VAL if self.val_mask[self.grid.block_of(i, j, block_chips)] else SPLIT_TRAIN

    def planned_counts(self, block_chips: int) -> tuple[int, int]:
        """(train, val) chips before the --min-valid filter."""
        val = sum(
            self.split_of(i, j, block_chips) == SPLIT_VAL
            for i in range(self.grid.rows)
            for j in range(self.grid.cols)
        )
        return self.grid.num_chips - val, val


@dataclass(frozen=True, slots=True)
class TilePlan:
    """Everything `tile` will do, known before reading a pixel (what --dry-run prints)."""

    config: TileConfig
    params: StoreParams
    class_map: ClassMap | None
    sources: tuple[SourcePlan, ...]
    max_train: int
    max_val: int

    @property
    def max_chips(self) -> int:
        return self.max_train + self.max_val

    @property
    def chip_bytes(self) -> int:
        c2 = self.params.chip_size**2
        return NUM_BANDS * c2 + (c2 if self.class_map is not None else 0)

    @property
    def raw_bytes(self) -> int:
        """Uncompressed bytes of every planned chip (an upper bound: --min-valid drops some)."""
        return self.max_chips * self.chip_bytes

    def ram_per_worker_bytes(self, world_size: int) -> int:
        """RAM a training rank needs for its in-memory share of the train split."""
        return -(-self.max_train // world_size) * (self.chip_bytes + 8)


@dataclass(frozen=True, slots=True)
class TileResult:
    url: str
    summary: StoreSummary
    sources_written: int
    sources_resumed: int  # already done in the store and skipped
    chips_written: int
    elapsed_s: float
    workers: int


@dataclass(slots=True)
class _WindowChips:
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


def _check_config(config: TileConfig) -> None:
    if config.chip_size < 1:
        raise TilingError(f"--chip-size must be positive, got {config.chip_size}")
    if config.effective_stride < 1:
        raise TilingError(f"--stride must be positive, got {config.stride}")
    if config.shard_size < 1:
        raise TilingError(f"--shard-size must be positive, got {config.shard_size}")
    if not 0.0 <= config.min_valid <= 1.0:
        raise TilingError(f"--min-valid must be in [0, 1], got {config.min_valid}")
    if not 0.0 <= config.val_fraction < 1.0:
        raise TilingError(f"--val-fraction must be in [0, 1), got {config.val_fraction}")
    if config.split_block_chips < 1:
        raise TilingError(f"split block must be at least 1 chip, got {config.split_block_chips}")
    if config.effective_workers < 1:
        raise TilingError(f"--workers must be at least 1, got {config.workers}")
    if not config.images:
        raise TilingError("no images given; pass GeoTIFF paths, globs or URLs")


def _class_map(config: TileConfig) -> ClassMap | None:
    if not config.labels:
        return None
    if config.class_map == IDENTITY:
        if config.num_classes is None:
            raise TilingError(
                "--class-map identity needs --num-classes K (label codes 0..K-1, 0 = nodata)"
            )
        return get_class_map(IDENTITY, num_classes=config.num_classes)
    return get_class_map(config.class_map)


def plan_tiling(config: TileConfig) -> TilePlan:
    """Expand and validate every input; no pixels are read and nothing is written."""
    _check_config(config)
    class_map = _class_map(config)
    options = config.storage_options
    image_paths = expand_inputs(config.images, storage_options=options, what="image")
    label_paths = (
        expand_inputs(config.labels, storage_options=options, what="label") if config.labels else ()
    )
    labels = [open_label(p, storage_options=options) for p in label_paths]
    stride = config.effective_stride
    sources: list[SourcePlan] = []
    first_block = 0
    max_train = max_val = 0
    for source_id, path in enumerate(image_paths):
        image = open_image(path, storage_options=options)
        grid = chip_grid(image.height, image.width, config.chip_size, stride, where=path)
        matched = match_labels(image, labels) if labels else ()
        windows = grid.read_windows(
            min_height_px=max(MIN_WINDOW_HEIGHT_PX, image.block_shape[0]),
            max_width_px=MAX_WINDOW_WIDTH_PX,
        )
        blocks = grid.num_blocks(config.split_block_chips)
        source = SourcePlan(
            id=source_id,
            image=image,
            labels=matched,
            grid=grid,
            windows=windows,
            val_mask=val_blocks(first_block, blocks, config.val_fraction),
        )
        first_block += blocks
        train, val = source.planned_counts(config.split_block_chips)
        max_train += train
        max_val += val
        sources.append(source)
    params = StoreParams(
        chip_size=config.chip_size,
        stride=stride,
        shard_size=config.shard_size,
        class_map=class_map,
        val_fraction=config.val_fraction,
        min_valid=config.min_valid,
        split_block_chips=config.split_block_chips,
        compression_level=config.compression_level,
        images=image_paths,
        labels=label_paths,
    )
    return TilePlan(
        config=config,
        params=params,
        class_map=class_map,
        sources=tuple(sources),
        max_train=max_train,
        max_val=max_val,
    )


def tile(
    config: TileConfig,
    *,
    plan: TilePlan | None = None,
    progress: Callable[[int], None] | None = None,
) -> TileResult:
    """Write (or resume) the chip store described by `config`.

    `progress(n)` is called after each read window with the number of candidate chips done.
    """
    start = time.perf_counter()
    plan = plan or plan_tiling(config)
    writer = open_writer(
        config.out,
        plan.params,
        storage_options=config.storage_options,
        overwrite=config.overwrite,
    )
    done = writer.done_source_ids
    todo = [s for s in plan.sources if s.id not in done]
    if done:
        logger.info(
            "resuming %s: %d of %d sources already done", config.out, len(done), len(plan.sources)
        )
    if progress is not None:
        skipped = sum(s.grid.num_chips for s in plan.sources if s.id in done)
        if skipped:
            progress(skipped)
    workers = config.effective_workers
    reader = RasterReader(storage_options=config.storage_options)
    tasks = [(source, window) for source in todo for window in source.windows]
    chips_before = writer.num_chips
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tile") as pool:
            results = _in_order(
                pool,
                tasks,
                lambda task: _cut_window(reader, plan, task[0], task[1]),
                lookahead=2 * workers,
            )
            try:
                _write_sources(writer, plan, todo, results, progress)
            finally:
                results.close()  # on failure: cancel the windows not started yet
    finally:
        reader.close()
    summary = writer.finish()
    elapsed = time.perf_counter() - start
    logger.info(
        "%s: %d chips from %d sources in %.1f s",
        config.out,
        summary.num_chips,
        len(plan.sources),
        elapsed,
    )
    return TileResult(
        url=config.out,
        summary=summary,
        sources_written=len(todo),
        sources_resumed=len(done),
        chips_written=summary.num_chips - chips_before,
        elapsed_s=elapsed,
        workers=workers,
    )


def _write_sources(
    writer: ChipStoreWriter,
    plan: TilePlan,
    todo: Sequence[SourcePlan],
    results: Iterator[_WindowChips],
    progress: Callable[[int], None] | None,
) -> None:
    """The single writer: append each source's windows in order, then commit the source."""
    num_classes = plan.class_map.num_classes if plan.class_map else 0
    for source in todo:
        writer.begin_source(_source_record(source))
        sums = [0] * NUM_BANDS
        sums_sq = [0] * NUM_BANDS
        valid_px = 0
        class_counts = np.zeros(num_classes, dtype=np.int64)
        train = val = 0
        for _ in source.windows:
            chips = next(results)
            writer.append_encoded(chips.images, chips.labels, chips.index)
            sums = [a + int(b) for a, b in zip(sums, chips.sums, strict=True)]
            sums_sq = [a + int(b) for a, b in zip(sums_sq, chips.sums_sq, strict=True)]
            valid_px += chips.valid_px
            class_counts += chips.class_counts
            train += chips.train
            val += chips.val
            if progress is not None:
                progress(chips.candidates)
        record = writer.commit_source(
            band_stats=BandStats(sums=tuple(sums), sums_sq=tuple(sums_sq), count=valid_px),
            class_counts=tuple(int(n) for n in class_counts),
            train_chips=train,
            val_chips=val,
        )
        logger.debug("%s: %d chips (%d val)", source.image.path, record.chips, val)


def _source_record(source: SourcePlan) -> SourceRecord:
    image = source.image
    a, b, c, d, e, f = tuple(image.transform)[:6]
    nodata = image.nodata
    return SourceRecord(
        id=source.id,
        path=image.path,
        crs=image.crs.to_wkt(),
        transform=(a, b, c, d, e, f),
        shape=(image.height, image.width),
        start=0,
        chips=0,
        state="writing",
        resolution_m=image.resolution_m,
        nodata=int(nodata) if nodata is not None and float(nodata).is_integer() else None,
        label_paths=tuple(lab.path for lab in source.labels),
    )


def _in_order(
    pool: ThreadPoolExecutor,
    tasks: Sequence[Any],
    fn: Callable[[Any], _WindowChips],
    *,
    lookahead: int,
) -> Generator[_WindowChips, None, None]:
    """Results of fn(task) in task order, with at most `lookahead` tasks in flight."""
    pending: deque[Future[_WindowChips]] = deque()
    it = iter(tasks)
    try:
        for task in it:
            pending.append(pool.submit(fn, task))
            if len(pending) >= lookahead:
                break
        while pending:
            result = pending.popleft().result()
            for task in it:
                pending.append(pool.submit(fn, task))
                break
            yield result
    finally:
        for future in pending:
            future.cancel()


def _cut_window(
    reader: RasterReader, plan: TilePlan, source: SourcePlan, window: ReadWindow
) -> _WindowChips:
    """Read one window, align labels, and keep the chips with enough valid pixels."""
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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceFormatError(
            f"{image.path}: cannot read pixels ({first}); re-download it or leave it out"
        ) from None
    if codes is not None:
        codes[~valid] = 0  # no label where the image has no data
    c = plan.params.chip_size
    block_chips = plan.params.split_block_chips
    min_valid_px = plan.params.min_valid * c * c
    num_classes = plan.class_map.num_classes if plan.class_map else 0
    encoder = ChunkEncoder(plan.params.compression_level)
    sums = np.zeros(NUM_BANDS, dtype=np.uint64)
    sums_sq = np.zeros(NUM_BANDS, dtype=np.uint64)
    valid_px = 0
    class_counts = np.zeros(num_classes, dtype=np.int64)
    images: list[EncodedChunk] = []
    labels: list[EncodedChunk] = []
    rows: list[tuple[int, int, int, int]] = []
    train = 0
    for i, j in window.chips:
        row, col = source.grid.chip_origin(i, j)
        r, k = row - window.row_px, col - window.col_px
        chip_valid = valid[r : r + c, k : k + c]
        n_valid = int(np.count_nonzero(chip_valid))
        if n_valid < min_valid_px:
            continue
        if codes is not None:
            chip_codes = codes[r : r + c, k : k + c]
            if np.count_nonzero(chip_codes) < min_valid_px:
                continue
            class_counts += np.bincount(chip_codes.ravel(), minlength=num_classes)[:num_classes]
            labels.append(encoder.encode(chip_codes))
        chip = pixels[:, r : r + c, k : k + c]
        values = chip.reshape(NUM_BANDS, -1) if n_valid == c * c else chip[:, chip_valid]
        wide = values.astype(np.uint32)  # 255² fits; sums are taken in uint64
        sums += wide.sum(axis=1, dtype=np.uint64)
        sums_sq += np.square(wide).sum(axis=1, dtype=np.uint64)
        valid_px += n_valid
        images.append(encoder.encode(chip))
        split = source.split_of(i, j, block_chips)
        train += split == SPLIT_TRAIN
        rows.append((source.id, row, col, split))
    return _WindowChips(
        images=images,
        labels=labels,
        index=np.array(rows, dtype=np.int32).reshape(-1, 4),
        sums=sums,
        sums_sq=sums_sq,
        valid_px=valid_px,
        class_counts=class_counts,
        train=train,
        val=len(rows) - train,
        candidates=len(window.chips),
    )
