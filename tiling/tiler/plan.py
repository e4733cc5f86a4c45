"""Planning a tile run: every input checked once, the split decided, before a pixel is read.

`plan_tiling` expands the inputs, validates each image and label raster (bands, dtype, CRS,
footprints), lays the chip grid over each image, places every chip centre on the ground
grid of the spatial split and decides the split over the whole run (`tiling.chipstore.split`). An
image smaller than one chip is skipped with a warning; the run fails only when every image
is. Nothing here writes, so `--dry-run` prints the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tiling.chipstore.params import StoreParams
from tiling.chipstore.records import NUM_BANDS, STATE_WRITING, SourceRecord
from tiling.chipstore.split import SplitRule, block_edge_m, chip_blocks, choose_split
from tiling.chipstore.store import SPLIT_TRAIN, SPLIT_VAL
from tiling.errors import TilingError
from tiling.runtime.fingerprint import Fingerprint
from tiling.sources.classes import IDENTITY, ClassMap, get_class_map
from tiling.sources.grid import ChipGrid, ReadWindow, chip_grid
from tiling.sources.labels import LabelIndex
from tiling.sources.rasters import RasterInfo, expand_inputs, open_image, open_label
from tiling.tiler.config import TileConfig

logger = logging.getLogger(__name__)

# Read windows at most this wide: bounds one worker's window to ~32 MB for 4-band uint8
# at the tallest usual window (1024 rows), however wide the mosaic.
MAX_WINDOW_WIDTH_PX = 8192
# Windows of labels and image are at least this tall (or one TIFF block, if taller), so
# a strip-organised file is read in a few large requests.
MIN_WINDOW_HEIGHT_PX = 256


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """One image to tile: its grid, labels, read windows and the split of each chip."""

    id: int
    image: RasterInfo
    labels: tuple[RasterInfo, ...]
    grid: ChipGrid
    windows: tuple[ReadWindow, ...]
    blocks: npt.NDArray[np.int64] = field(compare=False)  # (rows, cols, 2) ground blocks
    splits: npt.NDArray[np.int32] = field(compare=False)  # (rows, cols) SPLIT_TRAIN/VAL

    def split_of(self, i: int, j: int) -> int:
        return int(self.splits[i, j])

    def record(self, fingerprint: Fingerprint | None) -> SourceRecord:
        """The store's record of this source before its chips are appended."""
        image = self.image
        a, b, c, d, e, f = tuple(image.transform)[:6]
        nodata = image.nodata
        return SourceRecord(
            id=self.id,
            path=image.path,
            crs=image.crs.to_wkt(),
            transform=(a, b, c, d, e, f),
            shape=(image.height, image.width),
            start=0,
            chips=0,
            state=STATE_WRITING,
            resolution_m=image.resolution_m,
            nodata=int(nodata) if nodata is not None and float(nodata).is_integer() else None,
            label_paths=tuple(lab.path for lab in self.labels),
            mask_kind=image.mask_kind,
            fingerprint=fingerprint,
        )

    def planned_counts(self) -> tuple[int, int]:
        """(train, val) chips before the --min-valid filter."""
        val = int(np.count_nonzero(self.splits == SPLIT_VAL))
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
    split: SplitRule
    skipped: tuple[str, ...] = ()  # images smaller than one chip

    @property
    def num_classes(self) -> int:
        """Classes of the store's class map (0 for an images-only store)."""
        return self.class_map.num_classes if self.class_map else 0

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

    @property
    def num_blocks(self) -> tuple[int, int]:
        """(all, val) distinct ground blocks the planned chips fall in."""
        if not self.sources:
            return 0, 0
        blocks = np.concatenate([s.blocks.reshape(-1, 2) for s in self.sources])
        distinct = np.unique(blocks, axis=0)
        return len(distinct), int(np.count_nonzero(self.split.is_val(distinct)))

    def ram_per_worker_bytes(self, world_size: int) -> int:
        """RAM a training rank needs for its in-memory share of the train split."""
        return -(-self.max_train // world_size) * (self.chip_bytes + 8)


def class_map_of(config: TileConfig) -> ClassMap | None:
    """The store's class table for these options (None for an images-only store)."""
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
    """Expand and validate every input (the options are checked by `TileConfig`); no pixels
    are read and nothing is written."""
    config.check_inputs()
    class_map = class_map_of(config)
    options = config.storage_options
    image_paths = expand_inputs(config.images, storage_options=options, what="image")
    label_paths = (
        expand_inputs(config.labels, storage_options=options, what="label") if config.labels else ()
    )
    labels = [open_label(p, storage_options=options) for p in label_paths]
    stride = config.effective_stride
    images = [
        open_image(p, storage_options=options, zero_is_nodata=config.zero_is_nodata)
        for p in image_paths
    ]
    kept, skipped = _skip_small_images(images, config.chip_size)
    edge_m = block_edge_m(
        config.chip_size, config.split_block_chips, [image.resolution_m for image in kept]
    )
    label_index = LabelIndex(labels)
    placed = []
    for image in kept:
        grid = chip_grid(image.height, image.width, config.chip_size, stride, where=image.path)
        matched = label_index.match(image) if labels else ()
        placed.append(PlacedImage(image, grid, matched, chip_blocks(image, grid, edge_m)))
    rule = choose_split(
        np.concatenate([p.blocks.reshape(-1, 2) for p in placed]),
        val_fraction=config.val_fraction,
        edge_m=edge_m,
    )
    return assemble_plan(
        config,
        class_map=class_map,
        images=image_paths,
        labels=label_paths,
        placed=placed,
        split=rule,
        skipped=skipped,
    )


@dataclass(frozen=True, slots=True)
class PlacedImage:
    """An image as planning placed it: its chip grid, matched labels and ground blocks."""

    image: RasterInfo
    grid: ChipGrid
    labels: tuple[RasterInfo, ...]
    blocks: npt.NDArray[np.int64] = field(compare=False)  # (rows, cols, 2)


def assemble_plan(
    config: TileConfig,
    *,
    class_map: ClassMap | None,
    images: tuple[str, ...],
    labels: tuple[str, ...],
    placed: Sequence[PlacedImage],
    split: SplitRule,
    skipped: tuple[str, ...],
) -> TilePlan:
    """The plan of placed images (in input order, ids from 0) under `split`: read windows,
    each chip's split, the store's parameters and the planned counts. Pure arithmetic, no I/O
    (`tiling.tiler.planfile` rebuilds a published plan with it)."""
    sources = tuple(
        SourcePlan(
            id=source_id,
            image=p.image,
            labels=p.labels,
            grid=p.grid,
            windows=p.grid.read_windows(
                min_height_px=max(MIN_WINDOW_HEIGHT_PX, p.image.block_shape[0]),
                max_width_px=MAX_WINDOW_WIDTH_PX,
            ),
            blocks=p.blocks,
            splits=np.where(split.is_val(p.blocks), SPLIT_VAL, SPLIT_TRAIN).astype(np.int32),
        )
        for source_id, p in enumerate(placed)
    )
    counts = [s.planned_counts() for s in sources]
    params = StoreParams(
        chip_size=config.chip_size,
        stride=config.effective_stride,
        shard_size=config.shard_size,
        class_map=class_map,
        val_fraction=config.val_fraction,
        min_valid=config.min_valid,
        split_block_chips=config.split_block_chips,
        compression_level=config.compression_level,
        images=images,
        labels=labels,
        split=split,
        zero_is_nodata=config.zero_is_nodata,
    )
    return TilePlan(
        config=config,
        params=params,
        class_map=class_map,
        sources=sources,
        max_train=sum(train for train, _ in counts),
        max_val=sum(val for _, val in counts),
        split=split,
        skipped=skipped,
    )


def _skip_small_images(
    images: list[RasterInfo], chip_size: int
) -> tuple[list[RasterInfo], tuple[str, ...]]:
    """Images that hold at least one chip, and the paths of those that do not (warned).

    One small image (a sliver at the edge of a mosaic) must not abort a run of thousands;
    a run where no image fits is a wrong --chip-size and fails with the largest fit.
    """
    kept = [im for im in images if im.height >= chip_size and im.width >= chip_size]
    small = [im for im in images if im.height < chip_size or im.width < chip_size]
    for im in small:
        logger.warning(
            "%s: %d x %d px is smaller than --chip-size %d; skipped",
            im.path,
            im.height,
            im.width,
            chip_size,
        )
    if not kept:
        largest = max(images, key=lambda im: min(im.height, im.width))
        fit = min(largest.height, largest.width)
        raise TilingError(
            f"every image is smaller than --chip-size {chip_size} (the largest, {largest.path}, "
            f"is {largest.height} x {largest.width} px); pass --chip-size {fit} or smaller"
        )
    return kept, tuple(im.path for im in small)
