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

Ranks (`world_size` > 1, one process each, possibly on many machines): rank 0 plans the run
and publishes the plan beside the store (`tiling.planfile`), the others load it; each rank
cuts the sources `tiling.commit.assign_sources` gives it and stages each as a part beside
the store (`tiling.ranks`, `tiling.parts`); rank 0 alone writes the store, appending
the parts in input order (`tiling.commit`). docs/CONTRACTS.md, "Distributed tiling", has
the protocol. A one-process run reuses the parts an interrupted distributed run staged.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio.errors
import rasterio.windows

from tiling.chipstats import add_band_sums, count_classes
from tiling.commit import (
    CommitStats,
    check_rank,
    reusable_parts,
    source_owners,
    stored_done_chips,
    write_sources,
)
from tiling.errors import SourceFormatError, StoreError
from tiling.fingerprint import Fingerprint, fingerprints
from tiling.grid import ReadWindow
from tiling.parts import build_part, part_key
from tiling.plan import (
    MAX_WINDOW_WIDTH_PX,
    MIN_WINDOW_HEIGHT_PX,
    SourcePlan,
    TileConfig,
    TilePlan,
    available_cores,
    plan_tiling,
)
from tiling.planfile import plan_for_rank, publish_plan
from tiling.ranks import commit_ranks, stage_rank
from tiling.reader import RasterReader
from tiling.resume import check_done_sources, open_writer
from tiling.shards import ChunkEncoder, EncodedChunk
from tiling.staging import PartStaging
from tiling.store import (
    NUM_BANDS,
    SPLIT_TRAIN,
    StoreSummary,
)
from tiling.units import UnitRunner
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
    "stage_source",
    "tile",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TileResult:
    url: str
    store_summary: StoreSummary | None  # None on ranks other than 0 (rank 0 writes the store)
    sources_written: int  # cut by this process (rank 0 of several: committed)
    sources_resumed: int  # already done in the store and skipped
    chips_written: int
    elapsed_s: float
    workers: int
    rank: int = 0
    world_size: int = 1
    parts_cut: int = 0  # sources this rank cut into parts (distributed runs)
    commit: CommitStats = field(default_factory=CommitStats)  # rank 0 of several: its cost

    @property
    def summary(self) -> StoreSummary:
        """The finished store's summary (rank 0, or a one-process run)."""
        if self.store_summary is None:
            raise StoreError(
                f"{self.url}: rank {self.rank} of {self.world_size} staged its parts; "
                "rank 0 holds the store's summary"
            )
        return self.store_summary


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
    rank: int = 0,
    world_size: int = 1,
    run_units: UnitRunner | None = None,
) -> TileResult:
    """Write (or resume) the chip store described by `config`.

    `progress(n)` is called with numbers of candidate chips done: after each read window in a
    one-process run and on ranks > 0; on rank 0 of several, after each committed source.
    With `world_size` > 1 every rank calls this with the same config; rank 0 returns once the
    store is complete, the others once their parts are staged (no summary). `run_units` (one
    process): each source not yet in the store is first cut and staged as a unit of work
    there (`tiling.units`: tasks on a Dask cluster), then appended here from its part.
    """
    start = time.perf_counter()
    check_rank(rank, world_size)
    plan = plan or plan_for_rank(config, rank=rank, world_size=world_size)
    workers = config.effective_workers
    staging = PartStaging(config.out, config.storage_options)
    if rank == 0 and world_size > 1:
        publish_plan(plan, staging)  # the other ranks load it instead of planning the run
    owners = source_owners(plan, world_size)
    mine = [s for s in plan.sources if owners[s.id] == rank]
    labels = plan.params.labels if rank == 0 else [lab.path for s in mine for lab in s.labels]
    prints = _fingerprints(config, plan.sources if rank == 0 else mine, labels, workers)
    reader = RasterReader(storage_options=config.storage_options)
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tile") as pool:

            def cut(source: SourcePlan) -> Iterator[_WindowChips]:
                return _cut_windows(pool, reader, plan, [source], workers)

            if rank > 0:
                done = (lambda: []) if config.overwrite else _done_reader(config, plan)
                staged = stage_rank(
                    plan, mine, staging, cut, prints, done_chips=done, progress=progress
                )
                return TileResult(
                    url=config.out,
                    store_summary=None,
                    sources_written=staged,
                    sources_resumed=len(mine) - staged,
                    chips_written=0,
                    elapsed_s=time.perf_counter() - start,
                    workers=workers,
                    rank=rank,
                    world_size=world_size,
                    parts_cut=staged,
                )
            writer = _open_writer(config, plan, prints, progress)
            done_ids = writer.done_source_ids
            todo = [s for s in plan.sources if s.id not in done_ids]
            chips_before = writer.num_chips
            stats, staged, used_staging = CommitStats(), 0, True
            if world_size == 1:
                if run_units is not None and todo:
                    run_units(
                        stage_source, [s.id for s in todo], shared=(config, plan), what="sources"
                    )
                names = staging.names()  # one listing: parts an interrupted run of ranks left
                used_staging = bool(names)
                reuse = reusable_parts(names, plan, todo, prints)
                windows = _cut_windows(
                    pool, reader, plan, [s for s in todo if s.id not in reuse], workers
                )
                try:
                    write_sources(
                        writer, plan, todo, windows, cut, staging, reuse, prints, progress
                    )
                finally:
                    windows.close()  # on failure: cancel the windows not started yet
            else:
                stats, staged = commit_ranks(
                    writer, plan, todo, owners, staging, cut, prints, progress=progress
                )
    finally:
        reader.close()
    summary = writer.finish()
    if used_staging:
        staging.remove()  # after the commit point: a crash between the two leaves only garbage
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
        store_summary=summary,
        sources_written=len(todo),
        sources_resumed=len(done_ids),
        chips_written=summary.num_chips - chips_before,
        elapsed_s=elapsed,
        workers=workers,
        rank=rank,
        world_size=world_size,
        parts_cut=staged,
        commit=stats,
    )


def _open_writer(
    config: TileConfig,
    plan: TilePlan,
    prints: dict[str, Fingerprint],
    progress: Callable[[int], None] | None,
) -> ChipStoreWriter:
    """Create or resume the store; count its done sources as progress."""
    writer = open_writer(
        config.out,
        plan.params,
        storage_options=config.storage_options,
        overwrite=config.overwrite,
        fingerprints=prints,
    )
    check_done_sources(writer, {s.id: s.image.path for s in plan.sources})
    done = writer.done_source_ids
    if done:
        logger.info(
            "resuming %s: %d of %d sources already done", config.out, len(done), len(plan.sources)
        )
    if progress is not None:
        skipped = sum(s.grid.num_chips for s in plan.sources if s.id in done)
        if skipped:
            progress(skipped)
    return writer


def _fingerprints(
    config: TileConfig, sources: Sequence[SourcePlan], labels: Sequence[str], workers: int
) -> dict[str, Fingerprint]:
    """Fingerprints of the images of `sources` and of `labels`, by path."""
    inputs = [s.image.path for s in sources] + list(dict.fromkeys(labels))
    return dict(
        zip(inputs, fingerprints(inputs, config.storage_options, workers=workers), strict=True)
    )


def _done_reader(config: TileConfig, plan: TilePlan) -> Callable[[], list[int]]:
    """The chips of each source the store holds as committed, asked afresh each time."""
    digest = plan.params.digest()
    return lambda: stored_done_chips(config.out, digest, config.storage_options)


def _cut_windows(
    pool: ThreadPoolExecutor,
    reader: RasterReader,
    plan: TilePlan,
    sources: Sequence[SourcePlan],
    workers: int,
) -> Generator[_WindowChips, None, None]:
    """The cut windows of `sources`, in order, `2 * workers` windows in flight."""
    tasks = [(source, window) for source in sources for window in source.windows]
    return _in_order(
        pool, tasks, lambda task: _cut_window(reader, plan, task[0], task[1]), lookahead=2 * workers
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
            class_counts += count_classes(chip_codes, num_classes)
            labels.append(encoder.encode(chip_codes))
        chip = np.ascontiguousarray(pixels[:, r : r + c, k : k + c])
        add_band_sums(chip, sums, sums_sq)
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


def stage_source(config: TileConfig, plan: TilePlan, source_id: int) -> int:
    """Cut source `source_id` of `plan` and stage its part (kept when already staged whole
    under the same key); the part's chips."""
    source = plan.sources[source_id]
    paths = [source.image.path, *(label.path for label in source.labels)]
    workers = config.effective_workers
    prints = dict(
        zip(paths, fingerprints(paths, config.storage_options, workers=workers), strict=True)
    )
    key = part_key(plan.params, source, prints)
    staging = PartStaging(config.out, config.storage_options)
    staged = staging.get(source.id, key)
    if staged is not None and staged.interior is None:
        return staged.num_chips
    reader = RasterReader(storage_options=config.storage_options)
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tile") as pool:
            windows = _cut_windows(pool, reader, plan, [source], workers)
            part = build_part(source.id, key, plan.num_classes, windows)
    finally:
        reader.close()
    staging.put(part)
    return part.num_chips
