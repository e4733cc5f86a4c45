"""Rank 0's last step of a distributed prediction: wait for every rank's part, mosaic the
parts through a VRT and write the COG (and the probabilities) as a one-process run does.

The VRT starts as GDAL's copy of one part, so it carries the same colour table, band names,
scales, class tags and nodata as the tiled file of a one-process run; it is widened to the
whole grid, with one source per part at the part's rows. GDAL's COG driver reads pixels and
metadata through it as it reads that tiled file, and the COG comes out byte for byte the
same (tests/landcover/prediction/test_distributed.py). Rows no part covers (shares without
rows) read as nodata, as unwritten tiles do.
"""

from __future__ import annotations

import copy
import logging
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import rasterio.shutil

from landcover.errors import PredictionError
from landcover.prediction.outfiles import OutputPaths, TempOutputs, write_cogs
from landcover.prediction.outgrid import OutputGrid
from landcover.prediction.parts import CLASSES, PROBABILITIES, RECORD, PartRecord, Staging
from landcover.prediction.ranks import RankShare
from tiling.staged import PollSchedule, wait_for_records

logger = logging.getLogger(__name__)

# On blob storage polls start fast and slow down: rank 0 waits at most half again as long as
# the last part took to arrive (0.1 s early on, 5 s once a state's hours-long parts are still
# running). On a local or mounted path it looks every 0.05 s (tiling.runtime.polling). The tiled
# product's rank 0 waits for tile records on the same schedule.
PART_POLL = PollSchedule(first_s=0.1, max_s=5.0, growth=1.5)


def wait_for_parts(
    staging: Staging,
    expected: Sequence[tuple[RankShare, str]],
    world_size: int,
    *,
    schedule: PollSchedule = PART_POLL,
) -> list[PartRecord]:
    """The committed records of every (share, key) in `expected`, by rank; polls the
    staging area until all are there (the engine stops this rank if another one dies)."""
    keys = {share.rank: key for share, key in sorted(expected, key=lambda e: e[0].rank)}

    def waiting(seconds: float, pending: list[int]) -> None:
        shown = ", ".join(str(r) for r in pending[:10])
        more = f" and {len(pending) - 10} more" if len(pending) > 10 else ""
        logger.info("waiting for the parts of rank(s) %s%s in %s", shown, more, staging.url)

    found = wait_for_records(
        staging,
        {rank: staging.name(rank, world_size, key, RECORD) for rank, key in keys.items()},
        lambda rank: staging.read_record(rank, world_size, keys[rank]),
        schedule=schedule,
        waiting=waiting,
    )
    return [found[rank] for rank in sorted(found)]


def assemble(
    staging: Staging,
    records: Sequence[PartRecord],
    grid: OutputGrid,
    outputs: OutputPaths,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Write the outputs from the parts (atomically), then remove the staging area."""
    # The VRT sits beside its parts: in the staging directory, or with their downloads.
    with staging.scratch() as into, TempOutputs(outputs, storage_options) as temps:
        classes = parts_vrt(staging, records, grid, CLASSES, into)
        prob = None
        if outputs.probabilities is not None:
            prob = parts_vrt(staging, records, grid, PROBABILITIES, into)
        write_cogs(temps, classes, prob)
        temps.commit()
    staging.remove()


def parts_vrt(
    staging: Staging, records: Sequence[PartRecord], grid: OutputGrid, kind: str, into: str
) -> str:
    """A VRT of the whole grid over the parts' `kind` files, written in `into`."""
    parts = [
        (r, staging.fetch(staging.name(r.rank, r.world_size, r.key, kind), into))
        for r in records
        if kind in r.file_bytes
    ]
    if not parts:  # cannot happen: the shares cover every row of the grid
        raise PredictionError(f"{staging.url}: no part holds {kind} rows")
    token = uuid.uuid4().hex[:8]
    template = str(Path(into) / f".assembly.{token}.{kind}.template.vrt")
    rasterio.shutil.copy(parts[0][1], template, driver="VRT")
    tree = ET.parse(template)
    Path(template).unlink()
    root = tree.getroot()
    root.set("rasterYSize", str(grid.height))
    transform = root.find("GeoTransform")
    if transform is not None:
        transform.text = ", ".join(f"{v:.16e}" for v in grid.transform.to_gdal())
    for band in root.iter("VRTRasterBand"):
        sources = [e for e in band if e.tag in ("SimpleSource", "ComplexSource")]
        for source in sources:
            band.remove(source)
        for record, path in parts:
            band.append(_placed(sources[0], path, into, record))
    vrt = str(Path(into) / f".assembly.{token}.{kind}.vrt")
    tree.write(vrt, encoding="utf-8")
    return vrt


def _placed(source: ET.Element, path: str, into: str, record: PartRecord) -> ET.Element:
    """A copy of a VRT source reading file `path` (rows [row0, row1) of the grid) in place."""
    placed = copy.deepcopy(source)
    rows = str(record.row1 - record.row0)
    name = placed.find("SourceFilename")
    if name is not None:
        relative = Path(path).parent == Path(into)
        name.set("relativeToVRT", "1" if relative else "0")
        name.text = Path(path).name if relative else path
    properties = placed.find("SourceProperties")
    if properties is not None:
        properties.set("RasterYSize", rows)
    for tag, offset in (("SrcRect", 0), ("DstRect", record.row0)):
        rect = placed.find(tag)
        if rect is not None:
            rect.set("yOff", str(offset))
            rect.set("ySize", rows)
    return placed
