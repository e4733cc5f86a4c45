"""The plan file: a distributed tile run's plan, made once by rank 0 and read by the others.

Planning opens every input, matches labels to images and places every chip on the split
grid; at a state's thousands of sources it is most of what a rank does before it cuts, so
only one rank does it. Rank 0 plans (it checks the inputs, so a job refuses bad
input once) and publishes the plan in the staging folder beside the store,
`<store>.parts/plan.<key>.json` (`PartStaging.put_plan`: written whole, renamed or uploaded
in one piece). Every other rank expands the same inputs (listings), stamps each (a stat, no
read) to make the key, and loads the plan published under it instead of planning.
docs/CONTRACTS.md, "Plan file", is the contract.

The key is a digest of the plan format, every option that changes the plan (every
`TileConfig` field but where the store goes and how this process runs it), the expanded
image and label paths in order and the size and modification stamp of each: a plan of other
inputs or options, or of a file that changed since, has another name and is never opened. A
rank that finds no plan under its key in `plan_wait_s` plans the run itself, as every rank
did before, so a late or dead rank 0 never holds it; a plan that does not parse, or whose
parameters do not match what the rank's own options give, is never used.

A file under the right name is not trusted for its name alone (a copy left from another run
may have been edited): its last field is the SHA-256 of everything before it, and a rank
checks each image and label it cuts from the plan against the file itself (CRS, transform,
shape, bands, nodata: the header it opens to cut anyway, `check_plan_sources`). A plan that
fails either check is logged and the rank plans the run itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import numpy.typing as npt
from affine import Affine
from rasterio.crs import CRS

from tiling.chipstore.split import SplitRule
from tiling.runtime.fingerprint import stamps
from tiling.sources.grid import chip_grid
from tiling.sources.rasters import RasterInfo, expand_inputs, open_image, open_label
from tiling.staged import PollSchedule, content_key, poll
from tiling.tiler import stager as stager_module
from tiling.tiler.commit import source_owners
from tiling.tiler.config import TileConfig
from tiling.tiler.plan import (
    PlacedImage,
    SourcePlan,
    TilePlan,
    assemble_plan,
    class_map_of,
    plan_tiling,
)
from tiling.tiler.staging import PartStaging

__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "check_plan_sources",
    "plan_for_rank",
    "plan_from_json",
    "plan_key",
    "plan_to_json",
    "plan_wait_s",
    "publish_plan",
]

logger = logging.getLogger(__name__)

PLAN_FORMAT = "landcover-tile-plan"
PLAN_VERSION = 2  # 2: the content digest, last

# TileConfig fields that do not change the plan: where the store goes and how this process
# runs. Every other field is in the key, a field added later included.
NOT_IN_KEY = frozenset({"images", "labels", "out", "workers", "storage_options", "overwrite"})

# On top of `tiling.tiler.stager.COUNT_WAIT_S`, how long a rank waits for rank 0's plan per input:
# planning takes milliseconds per local source (benchmarks/bench_state.py prints the rate), so
# this covers a slow shared file system many times over before a rank plans the run itself.
PLAN_WAIT_PER_INPUT_S = 0.02
PLAN_POLL = PollSchedule(first_s=0.05, max_s=1.0)  # how a rank polls for rank 0's plan


def plan_key(
    config: TileConfig,
    images: Sequence[str],
    labels: Sequence[str],
    input_stamps: Sequence[tuple[int, str]],
) -> str:
    """The plan's key: a digest of the plan format, the options that change the plan, the
    expanded inputs in order and the (size, modification stamp) of each, images first."""
    options = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in NOT_IN_KEY}
    options["stride"] = config.effective_stride
    body = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "options": options,
        "images": list(images),
        "labels": list(labels),
        "stamps": [list(s) for s in input_stamps],
    }
    return content_key(body)


def _key_of(config: TileConfig, images: Sequence[str], labels: Sequence[str]) -> str:
    inputs = [*images, *labels]
    return plan_key(config, images, labels, stamps(inputs, config.storage_options))


def publish_plan(plan: TilePlan, staging: PartStaging) -> str:
    """Rank 0: write `plan` under its key in the staging folder; the key."""
    key = _key_of(plan.config, plan.params.images, plan.params.labels)
    staging.put_plan(key, plan_to_json(plan, key))
    logger.debug("%s: published the plan of %d sources", staging.url, len(plan.sources))
    return key


def plan_wait_s(inputs: int) -> float:
    """How long a rank waits for rank 0's plan of `inputs` files before planning itself."""
    return stager_module.COUNT_WAIT_S + PLAN_WAIT_PER_INPUT_S * inputs


def plan_for_rank(config: TileConfig, *, rank: int, world_size: int) -> TilePlan:
    """This rank's plan of the run: rank 0 (and a one-process run) plans it; any other rank
    loads the plan rank 0 publishes under the key of its own inputs and options, waiting for
    it up to `plan_wait_s`, and plans the run itself when none comes."""
    if rank == 0 or world_size <= 1:
        return plan_tiling(config)
    config.check_inputs()
    options = config.storage_options
    images = expand_inputs(config.images, storage_options=options, what="image")
    labels = (
        expand_inputs(config.labels, storage_options=options, what="label") if config.labels else ()
    )
    key = _key_of(config, images, labels)
    staging = PartStaging(config.out, options)
    start = time.monotonic()
    deadline = start + plan_wait_s(len(images) + len(labels))
    body = poll(
        lambda: staging.get_plan(key),
        url=staging.url,
        schedule=PLAN_POLL,
        give_up=lambda: time.monotonic() > deadline,
    )
    if body is None:
        logger.info("no plan from rank 0 after %.1f s; planning here", time.monotonic() - start)
        return plan_tiling(config)
    try:
        plan = plan_from_json(config, body, key=key, images=images, labels=labels)
        owners = source_owners(plan, world_size)
        check_plan_sources(config, [s for s in plan.sources if owners[s.id] == rank])
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        logger.warning("%s: plan %s not used (%s); planning here", staging.url, key, exc)
        return plan_tiling(config)
    logger.info(
        "loaded the plan of %d sources rank 0 published, after %.1f s",
        len(plan.sources),
        time.monotonic() - start,
    )
    return plan


def plan_to_json(plan: TilePlan, key: str) -> bytes:
    """The plan file's bytes: what planning found (rasters, matches, ground blocks, the split
    rule, skipped images); what follows from them by arithmetic is rebuilt on load."""
    crs_table: dict[str, int] = {}
    label_ids: dict[str, int] = {}
    labels: list[dict[str, Any]] = []
    for source in plan.sources:
        for lab in source.labels:
            if lab.path not in label_ids:
                label_ids[lab.path] = len(labels)
                labels.append(_raster_json(lab, crs_table))
    sources = [
        {
            "image": _raster_json(s.image, crs_table),
            "labels": [label_ids[lab.path] for lab in s.labels],
            "blocks": _pack(s.blocks),
        }
        for s in plan.sources
    ]
    body = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "key": key,
        "params_sha256": plan.params.digest(),
        "split": plan.split.to_json(),
        "skipped": list(plan.skipped),
        "crs": list(crs_table),
        "labels": labels,
        "sources": sources,
    }
    body[DIGEST_FIELD] = _content_digest(body)  # last: it vouches for every field before it
    return json.dumps(body, separators=(",", ":")).encode()


DIGEST_FIELD = "sha256"


def _content_digest(body: Mapping[str, Any]) -> str:
    """The SHA-256 of a plan's fields but its digest, written with sorted keys."""
    content = {k: v for k, v in body.items() if k != DIGEST_FIELD}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def plan_from_json(
    config: TileConfig,
    body: bytes,
    *,
    key: str,
    images: Sequence[str],
    labels: Sequence[str],
) -> TilePlan:
    """The plan in a plan file's bytes, for this rank's `config` and expanded inputs;
    ValueError when it is of another format, key or parameters."""
    obj = json.loads(body)
    if obj.get("format") != PLAN_FORMAT or obj.get("version") != PLAN_VERSION:
        raise ValueError(f"not a version {PLAN_VERSION} {PLAN_FORMAT}")
    if obj.get("key") != key:
        raise ValueError(f"made under key {obj.get('key')}")
    if obj.get(DIGEST_FIELD) != _content_digest(obj):
        raise ValueError("its content does not match its digest: edited or damaged")
    crs = [CRS.from_wkt(wkt) for wkt in obj["crs"]]
    label_infos = [_raster(r, crs) for r in obj["labels"]]
    stride = config.effective_stride
    placed = []
    for s in obj["sources"]:
        image = _raster(s["image"], crs)
        grid = chip_grid(image.height, image.width, config.chip_size, stride, where=image.path)
        blocks = _unpack(s["blocks"], (grid.rows, grid.cols, 2))
        matched = tuple(label_infos[i] for i in s["labels"])
        placed.append(PlacedImage(image, grid, matched, blocks))
    plan = assemble_plan(
        config,
        class_map=class_map_of(config),
        images=tuple(images),
        labels=tuple(labels),
        placed=placed,
        split=SplitRule.from_json(obj["split"]),
        skipped=tuple(obj["skipped"]),
    )
    if plan.params.digest() != obj["params_sha256"]:
        raise ValueError("its store parameters differ from this rank's")
    return plan


def check_plan_sources(config: TileConfig, sources: Sequence[SourcePlan]) -> None:
    """Raise ValueError naming the first image or label of `sources` whose description in
    a loaded plan differs from the file's own header (CRS, transform, shape, bands, dtype,
    nodata, block shape, mask): a rank opens the files it cuts anyway, so a plan edited
    since rank 0 wrote it cannot place their chips."""
    options = config.storage_options
    for source in sources:
        actual = open_image(
            source.image.path, storage_options=options, zero_is_nodata=config.zero_is_nodata
        )
        _same_raster(source.image, actual)
        for label in source.labels:
            _same_raster(label, open_label(label.path, storage_options=options))


def _same_raster(planned: RasterInfo, actual: RasterInfo) -> None:
    if planned != actual:
        raise ValueError(
            f"{planned.path} is described otherwise than its file (transform "
            f"{tuple(planned.transform)[:6]} against {tuple(actual.transform)[:6]})"
        )


def _raster_json(info: RasterInfo, crs_table: dict[str, int]) -> dict[str, Any]:
    wkt = info.crs.to_wkt()
    return {
        "path": info.path,
        "crs": crs_table.setdefault(wkt, len(crs_table)),
        "transform": list(info.transform)[:6],  # floats print exactly (repr) and parse back
        "shape": [info.height, info.width],
        "count": info.count,
        "dtype": info.dtype,
        "nodata": info.nodata,
        "block": list(info.block_shape),
        "mask": info.mask_kind,
    }


def _raster(obj: Mapping[str, Any], crs: Sequence[CRS]) -> RasterInfo:
    height, width = obj["shape"]
    block_h, block_w = obj["block"]
    nodata = obj["nodata"]
    return RasterInfo(
        path=str(obj["path"]),
        crs=crs[int(obj["crs"])],
        transform=Affine(*(float(v) for v in obj["transform"])),
        height=int(height),
        width=int(width),
        count=int(obj["count"]),
        dtype=str(obj["dtype"]),
        nodata=None if nodata is None else float(nodata),
        block_shape=(int(block_h), int(block_w)),
        mask_kind=str(obj["mask"]),
    )


def _pack(blocks: npt.NDArray[np.int64]) -> str:
    """Ground blocks as base64 of zlib'd little-endian int64: neighbouring chips share blocks,
    so a NAIP quarter-quad's ~1,350 numbers compress to a few hundred bytes."""
    raw = np.ascontiguousarray(blocks, dtype="<i8").tobytes()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def _unpack(text: str, shape: tuple[int, int, int]) -> npt.NDArray[np.int64]:
    raw = zlib.decompress(base64.b64decode(text))
    blocks = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    if blocks.size != shape[0] * shape[1] * shape[2]:
        raise ValueError(f"{blocks.size} ground blocks for a grid of {shape[0]} x {shape[1]} chips")
    return blocks.reshape(shape)
