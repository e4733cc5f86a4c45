"""`TileConfig`: the options of a tile run, the one definition of `landcover tile`'s options.

Each field that is an option declares its flag and help (`tiling.runtime.flags.option`); the
command generates its click options from them (`landcover.cli.tiling`) and builds the config
from the parsed values, as `landcover.api.tile` and the notebooks build it from keywords. The
values no run can use are refused once, here, in the constructor (one line naming the
option). Cheap to import (no rasterio, zarr or fsspec), so that the CLI reads it at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tiling.errors import TilingError
from tiling.runtime.flags import flag, option
from tiling.runtime.machine import local_cpu_count
from tiling.runtime.urls import check_storage_options
from tiling.sources.classes import DEFAULT_CLASS_MAP, IDENTITY

__all__ = ["COMPRESSION_LEVEL", "SPLIT_BLOCK_CHIPS", "TileConfig"]

COMPRESSION_LEVEL = 3  # zstd level of the chips
SPLIT_BLOCK_CHIPS = 4  # edge of a ground block of the split, in chips


@dataclass(frozen=True, slots=True)
class TileConfig:
    """Options of `landcover tile`; checked when made (`TilingError`, one line)."""

    images: tuple[str, ...]  # IMAGES, resolved (globs, STAC items) by the command
    out: str = field(metadata=flag("--out", "Store URL: path, NFS path, az://container/x.zarr."))
    labels: tuple[str, ...] = option(
        "--labels",
        (),
        "Label rasters: a file, directory or quoted glob (repeatable). Matched to images by "
        "footprint, warped onto the image grid. Omit for an images-only store.",
    )
    chip_size: int = option("--chip-size", 256, "Chip side in px.")
    stride: int | None = option(  # None: chip_size (no overlap)
        "--stride", None, "Step between chips in px [chip size]."
    )
    shard_size: int = option("--shard-size", 64, "Chips per shard object.")
    min_valid: float = option(
        "--min-valid", 0.9, "Skip chips whose valid fraction (image or label) is below this."
    )
    class_map: str = option(
        "--class-map", DEFAULT_CLASS_MAP, "Remap of raw label values onto the class table."
    )
    num_classes: int | None = option(  # only for class_map="identity"
        "--num-classes", None, "Classes incl. nodata 0, for --class-map identity."
    )
    val_fraction: float = option(
        "--val-fraction",
        0.1,
        f"Share of ground blocks ({SPLIT_BLOCK_CHIPS} x {SPLIT_BLOCK_CHIPS} chips on one grid "
        "for all images) held out for validation; a place is in one split whatever image it "
        "came from, and any run with two or more blocks gets at least one val block.",
    )
    split_block_chips: int = SPLIT_BLOCK_CHIPS
    workers: int | None = option(  # None: every available core
        "--workers", None, "Reader threads [the cores this process may use]."
    )
    storage_options: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag("--storage-options")
    )
    overwrite: bool = False
    compression_level: int = COMPRESSION_LEVEL
    # no nodata tag, no mask: 0 in all four bands is nodata; the flag alone turns it off
    zero_is_nodata: bool = option(
        "--no-zero-nodata",
        True,
        "Keep pixels that are 0 in all four bands as imagery. By default they are nodata when "
        "a file declares no nodata value and no mask (black collars of NAIP quads).",
    )

    def __post_init__(self) -> None:
        """Refuse options no run can use (one line naming the option and its value)."""
        if self.chip_size < 1:
            raise TilingError(f"--chip-size must be positive, got {self.chip_size}")
        if self.effective_stride < 1:
            raise TilingError(f"--stride must be positive, got {self.stride}")
        if self.shard_size < 1:
            raise TilingError(f"--shard-size must be positive, got {self.shard_size}")
        if not 0.0 <= self.min_valid <= 1.0:
            raise TilingError(f"--min-valid must be in [0, 1], got {self.min_valid}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise TilingError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.split_block_chips < 1:
            raise TilingError(f"split block must be at least 1 chip, got {self.split_block_chips}")
        if self.effective_workers < 1:
            raise TilingError(f"--workers must be at least 1, got {self.workers}")
        if self.num_classes is not None and self.class_map != IDENTITY:
            raise TilingError(
                f"--num-classes {self.num_classes} applies only to --class-map identity "
                f"(got --class-map {self.class_map}); drop --num-classes or pass "
                "--class-map identity"
            )

    def check_inputs(self) -> None:
        """Refuse a run without images, or with --storage-options when every URL of the run
        is a local path; checked when the run starts (a config may be made before its URLs
        are known, and `dataclasses.replace` them)."""
        if not self.images:
            raise TilingError("no images given; pass GeoTIFF paths, globs or URLs")
        check_storage_options((*self.images, *self.labels, self.out), self.storage_options)

    @property
    def effective_stride(self) -> int:
        return self.chip_size if self.stride is None else self.stride

    @property
    def effective_workers(self) -> int:
        return local_cpu_count() if self.workers is None else self.workers
