"""Orchestration: sources → chip grid → chip store, in parallel, resumable, deterministic.

`plan_tiling` (tiling.plan) checks every input once at the boundary (files, bands, dtype,
CRS, label footprints, chip size) and decides the split without reading pixels; `tile`
then writes the store.

Parallelism: K worker threads each read one window of an image (GDAL decodes with the GIL
released), align its labels, and cut, filter and count its chips; the calling thread is the
single writer and appends the windows' chips strictly in input order (sources in the order
given, windows row-major), while zarr compresses shards on its own thread pool. The store
is therefore byte-for-byte the same for any K. Threads rather than processes: nothing has
to be pickled, and adlfs/zarr event loops do not survive a fork.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.errors
import rasterio.windows

from tiling.errors import SourceFormatError, StoreError
from tiling.fingerprint import Fingerprint, fingerprints
from tiling.grid import ReadWindow
from tiling.plan import (
    MAX_WINDOW_WIDTH_PX,
    MIN_WINDOW_HEIGHT_PX,
    SourcePlan,
    TileConfig,
    TilePlan,
    available_cores,
    plan_tiling,
)
from tiling.reader import RasterReader
from tiling.resume import open_writer
from tiling.shards import ChunkEncoder, EncodedChunk
from tiling.store import (
    NUM_BANDS,
    SPLIT_TRAIN,
    BandStats,
    SourceRecord,
    StoreSummary,
)
from tiling.writer import ChipStoreWriter

__all__ = [
    "MAX_WINDOW_WIDTH_PX",
    "MIN_WINDOW_HEIGHT_PX",
    "SourcePlan",
    "TileConfig",
    "TilePlan",
    "TileResult",
    "available_cores",
    "plan_tiling",
    "tile",
]

logger = logging.getLogger(__name__)


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
    workers = config.effective_workers
    inputs = [s.image.path for s in plan.sources] + list(plan.params.labels)
    prints = dict(
        zip(
            inputs,
            fingerprints(inputs, config.storage_options, workers=workers),
            strict=True,
        )
    )
    writer = open_writer(
        config.out,
        plan.params,
        storage_options=config.storage_options,
        overwrite=config.overwrite,
        fingerprints=prints,
    )
    _check_done_sources_match(writer, plan)
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
                _write_sources(writer, plan, todo, results, progress, prints)
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
    prints: dict[str, Fingerprint],
) -> None:
    """The single writer: append each source's windows in order, then commit the source."""
    num_classes = plan.class_map.num_classes if plan.class_map else 0
    for source in todo:
        writer.begin_source(_source_record(source, prints.get(source.image.path)))
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


def _check_done_sources_match(writer: ChipStoreWriter, plan: TilePlan) -> None:
    """A resumed store's done sources must be the plan's sources of the same ids."""
    planned = {s.id: s.image.path for s in plan.sources}
    for record in writer.done_sources:
        if planned.get(record.id) != record.path:
            raise StoreError(
                f"{writer.url}: source {record.id} was {record.path} when tiled but is now "
                f"{planned.get(record.id, 'absent')}; pass --overwrite to rebuild the store"
            )


def _source_record(source: SourcePlan, fingerprint: Fingerprint | None) -> SourceRecord:
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
        mask_kind=image.mask_kind,
        fingerprint=fingerprint,
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
    if codes is not None and not valid.all():
        np.multiply(codes, valid, out=codes)  # no label where the image has no data
    c = plan.params.chip_size
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
        n_valid = int(np.count_nonzero(valid[r : r + c, k : k + c]))
        if n_valid < min_valid_px:
            continue
        if codes is not None:
            chip_codes = np.ascontiguousarray(codes[r : r + c, k : k + c])
            if np.count_nonzero(chip_codes) < min_valid_px:
                continue
            class_counts += _class_counts(chip_codes, num_classes)
            labels.append(encoder.encode(chip_codes))
        chip = np.ascontiguousarray(pixels[:, r : r + c, k : k + c])
        _add_band_sums(chip, sums, sums_sq)
        valid_px += n_valid
        images.append(encoder.encode(chip))
        split = source.split_of(i, j)
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


def _add_band_sums(
    chip: npt.NDArray[np.uint8], sums: npt.NDArray[np.uint64], sums_sq: npt.NDArray[np.uint64]
) -> None:
    """Add the chip's per-band sums and sums of squares over its valid pixels, exactly.

    Over all its pixels: the reader returns invalid pixels as 0 in every band, which add
    nothing, so no gather of the valid ones. Squares in uint16 (255² fits), summed in uint32
    where a band's sum of squares fits (chips up to 257 px), else in uint64: a quarter of the
    memory traffic of squares in uint32 summed in uint64.
    """
    wide = chip.reshape(NUM_BANDS, -1).astype(np.uint16)
    total = np.uint32 if wide.shape[1] * 255 * 255 < 2**32 else np.uint64
    sums += wide.sum(axis=1, dtype=total)
    np.multiply(wide, wide, out=wide)
    sums_sq += wide.sum(axis=1, dtype=total)


# Up to this many classes, counting each code (a compare and a count per class) is cheaper
# than np.bincount, which first widens every uint8 code to int64.
_MAX_CLASSES_COUNTED_BY_COMPARE = 16


def _class_counts(codes: npt.NDArray[np.uint8], num_classes: int) -> npt.NDArray[np.int64]:
    """Pixels of each class code 0..num_classes-1 in `codes`."""
    if num_classes > _MAX_CLASSES_COUNTED_BY_COMPARE:
        return np.bincount(codes.ravel(), minlength=num_classes)[:num_classes]
    counts = np.empty(num_classes, dtype=np.int64)
    if num_classes:
        counts[0] = codes.size - np.count_nonzero(codes)
    for code in range(1, num_classes):
        counts[code] = np.count_nonzero(codes == code)
    return counts
