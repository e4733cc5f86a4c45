"""One rank of a distributed prediction, start to end.

Every rank of the job calls `run_rank` with the same plan: it takes its share of whole block
rows (`landcover.prediction.ranks`), predicts them into its part in the staging area beside
the output (`landcover.prediction.parts`; a part that an earlier run of the same job
committed is kept), and returns. Rank 0 then waits for every rank's part, writes the outputs
from them (`landcover.prediction.assemble`) and removes the staging area, so the job ends
with the outputs complete. The ranks coordinate through those files alone, never through
torch.distributed.

A rerun of a job with other options never mixes parts: every PredictConfig option that can
change a pixel is in the part's key (RERUN_PREDICTS_AGAIN, through `pixel_settings`, the
grid and the fingerprints of the model and images), so a part of another value is never
asked for; the others (RERUN_KEEPS_PARTS) change no pixel, and a finished part is kept.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from landcover.prediction.assemble import assemble, wait_for_parts
from landcover.prediction.blocks import require_predicted_pixels
from landcover.prediction.intofile import AreaCounts
from landcover.prediction.outfiles import OutputPaths
from landcover.prediction.parts import PartRecord, PartWriter, Staging, part_key
from landcover.prediction.prepared import PreparedPrediction
from landcover.prediction.ranks import RankShare, pooled_threads, sources_read, split_rows
from landcover.version import __version__
from tiling.runtime.fingerprint import fingerprint, fingerprints

logger = logging.getLogger(__name__)

# Every PredictConfig field is in one of the two (tests/landcover/prediction/test_distributed.py).
RERUN_PREDICTS_AGAIN = (
    "model",  # its fingerprint
    "images",  # the fingerprints of those a part reads
    "out",  # the staging area is beside it
    "region",
    "dst_crs",  # the grid
    "resolution",
    "overlap_px",
    "window",  # --window: the model's window edge
    "batch_size",
    "device",  # its type
    "backend",  # what ran (`auto` resolved: landcover.prediction.runtime.with_inference)
    "precision",
    "calibration",  # int8's store and its sample's digest (STORE@DIGEST once read)
    "tta",
    "adapt",  # with its statistics' digest (landcover.prediction.adapt)
    "probabilities",  # whether a part has them
    "block_px",
    "zero_is_nodata",
    "tile_px",  # a tiled product's (its tiles' keys hold it); a one COG, with parts, has none
)
RERUN_KEEPS_PARTS = ("overwrite", "storage_options", "progress", "max_pixels", "pipeline")


# Predicts `share` into the tiled GeoTIFFs (classes, probabilities or None) of its rows.
PredictShare = Callable[[RankShare, str, str | None], AreaCounts]


def pixel_settings(prepared: PreparedPrediction) -> dict[str, Any]:
    """What the pixels of a part (or of a tiled product's tile) depend on besides the model
    and the images (JSON values): a part made with other values has another key and is never
    reused. The one owner of that list, for parts and tiles alike."""
    grid, options, layout = prepared.grid, prepared.config, prepared.layout
    region = prepared.plan.region
    return {
        "landcover": __version__,
        "crs": grid.crs.to_wkt(),
        "transform": list(grid.transform)[:6],
        "size": [grid.width, grid.height],
        "region": None if region is None else hashlib.sha256(region.wkb).hexdigest(),
        "window": [layout.size, layout.overlap],
        "block_px": options.block_px,
        "batch_size": options.batch_size,
        "backend": options.backend,
        "precision": options.precision,
        "calibration": options.calibration,  # STORE@DIGEST for int8, else None
        "tta": options.tta,
        "adapt": options.adapt,  # METHOD:STRENGTH@DIGEST once computed
        "device": prepared.device.type,  # cpu, cuda, ...: a model may round differently
        "zero_is_nodata": options.zero_is_nodata,
        "probabilities": options.probabilities is not None,
    }


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank's place in a distributed prediction and what its part depends on."""

    prepared: PreparedPrediction
    outputs: OutputPaths
    rank: int
    world_size: int
    # The ranks that share this machine's cores (this one included): on the CPU they pool
    # their threads (`pooled_threads`). None: this rank keeps the threads it has.
    local_ranks: range | None = None

    def settings(self) -> dict[str, Any]:
        """What this rank's part's pixels depend on besides the model and the images
        (`pixel_settings`)."""
        return pixel_settings(self.prepared)


def run_rank(run: RankRun, predict: PredictShare) -> AreaCounts:
    """Predict this rank's share into its part; on rank 0 also wait for every part and write
    the outputs. Returns the windows run and the pixels per class code: the whole grid's on
    rank 0, this rank's share's on the others."""
    config, plan = run.prepared.config, run.prepared.plan
    shares = split_rows(plan, config.resolved_block_px, run.world_size)
    share = shares[run.rank]
    staging = Staging(run.outputs.out, config.storage_options)
    key = _keys(run, [share])[run.rank]
    record = staging.read_record(run.rank, run.world_size, key)
    if record is not None:
        logger.info("rank %d: keeping its finished part in %s", run.rank, staging.url)
    else:
        with _pooled_threads(run, shares):
            record = _write_part(run, staging, share, key, predict)
    if run.rank != 0:
        return AreaCounts(record.windows, np.asarray(record.class_pixels, dtype=np.int64))
    # Rank 0 accepts only the part each rank must write, so it needs every key: worked out
    # now, while the others still predict (fingerprinting a state's images takes a while).
    keys = _keys(run, shares)
    records = wait_for_parts(staging, [(s, keys[s.rank]) for s in shares], run.world_size)
    windows = sum(r.windows for r in records)
    class_pixels = np.sum([np.asarray(r.class_pixels, dtype=np.int64) for r in records], axis=0)
    require_predicted_pixels(class_pixels)
    assemble(staging, records, plan.grid, run.outputs, config.storage_options)
    return AreaCounts(windows, class_pixels)


@contextmanager
def _pooled_threads(run: RankRun, shares: Sequence[RankShare]) -> Iterator[None]:
    """Run with this rank's share of its machine's threads (CPU), then restore the count."""
    before = torch.get_num_threads()
    if run.local_ranks is None or run.prepared.device.type != "cpu":
        yield
        return
    threads = pooled_threads(shares, run.rank, run.local_ranks, before)
    if threads != before:
        logger.info(
            "rank %d: %d thread(s), pooled with ranks of this machine that have no rows",
            run.rank,
            threads,
        )
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write_part(
    run: RankRun, staging: Staging, share: RankShare, key: str, predict: PredictShare
) -> PartRecord:
    probabilities = run.outputs.probabilities is not None
    with PartWriter(staging, share, run.world_size, key, probabilities=probabilities) as part:
        if share.is_empty:  # more ranks than block rows with work: nothing to write
            return part.commit(0, np.zeros(run.prepared.meta.num_classes, dtype=np.int64))
        counts = predict(share, part.tiles_out, part.tiles_prob)
        record = part.commit(counts.windows, counts.class_pixels)
    logger.info(
        "rank %d: wrote rows %d-%d (%d windows) to %s",
        run.rank,
        share.row0,
        share.row1,
        record.windows,
        staging.url,
    )
    return record


def _keys(run: RankRun, shares: Sequence[RankShare]) -> dict[int, str]:
    """Each share's part key: fingerprints of the model and of the images the share reads
    (rank 0 fingerprints them all, the others only their own)."""
    config, plan, layout = run.prepared.config, run.prepared.plan, run.prepared.layout
    storage_options = config.storage_options
    model = fingerprint(config.model, storage_options)
    reads = {s.rank: sources_read(plan, s, layout) for s in shares}
    paths = list(dict.fromkeys(p for ranked in reads.values() for p in ranked))
    prints = dict(zip(paths, fingerprints(paths, storage_options), strict=True))
    settings = run.settings()
    return {
        s.rank: part_key(
            settings, model, [(p, prints[p]) for p in reads[s.rank]], s, run.world_size
        )
        for s in shares
    }
